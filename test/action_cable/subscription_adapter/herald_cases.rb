# frozen_string_literal: true

require_relative "../cable_helper"
require "digest"

# Rails' own adapter suite (test/fixtures/rails_adapter_suite: its `require "test_helper"` finds Herald's),
# unedited, against `adapter: herald` on each store.
test_dir = File.expand_path("../..", __dir__)
$LOAD_PATH.unshift(test_dir) unless $LOAD_PATH.include?(test_dir)
SUITE = File.expand_path("../../fixtures/rails_adapter_suite", __dir__)
require File.join(SUITE, "common")
require File.join(SUITE, "channel_prefix")

{log: "Log", redis: "Redis", postgres: "Postgres"}.each do |kind, name|
  Class.new(Minitest::Test) do
    include CommonSubscriptionAdapterTest
    include ChannelPrefixTest
    include Herald::CableTestSupport

    define_method(:cable_config) { {adapter: "herald", store: store_setting(kind)} }

    def teardown
      super
      shut_down_adapters
    end
  end.then { |suite| Object.const_set("RailsAdapterSuiteOn#{name}Test", suite) }
end

# The vendored files are the published ones: below their marker line, each hashes to the git blob named in
# its header (what `git hash-object` gives for the file at the Rails tag).
class RailsAdapterSuiteFixtureTest < Minitest::Test
  def test_the_vendored_files_are_unedited
    %w[common.rb channel_prefix.rb].each do |file|
      text = File.binread(File.join(SUITE, file))
      blob = text[/git blob (\h{40})/, 1]
      body = text.split("# --- vendored file ---\n", 2).last
      assert_equal blob, Digest::SHA1.hexdigest("blob #{body.bytesize}\0#{body}"), "#{file} differs from Rails' blob"
    end
    assert_match(/Copyright \(c\) 37signals/, File.read(File.join(SUITE, "MIT-LICENSE")))
  end
end

# What the adapter adds to Rails' suite, on every store: payloads byte for byte, the namespace, settings.
class HeraldCableAdapterTest < Minitest::Test
  include Herald::CableTestSupport

  def teardown = shut_down_adapters

  def adapters(kind, **cable)
    server = cable_server(store: store_setting(kind), **cable)
    [server.config.pubsub_adapter.new(server), server.config.pubsub_adapter.new(server)]
  end

  # 1 MB and 10 MB, non-ASCII, emoji, NUL, empty, JSON with escapes, and bytes that are not UTF-8.
  def payloads
    rng = Random.new(seed = Random.new_seed % 100_000)
    warn "payload seed #{seed}" if ENV["VERBOSE"]
    alphabet = ["a", "é", "中", "🎉", "\u0000", "\"", "\\", "<turbo-stream>", "\n"]
    [
      "", "héllo wörld ✓", "🎉" * 1000, "a\u0000b", %({"message":"<turbo-stream action=\\"append\\">ü</turbo-stream>"}),
      Array.new(1 << 20) { alphabet[rng.rand(alphabet.size)] }.join.byteslice(0, 1 << 20).scrub("").then { |s| s + "a" * ((1 << 20) - s.bytesize) },
      Random.new(seed).bytes(10 << 20).tr("\x80-\xff".b, "a").force_encoding(Encoding::UTF_8),
      "\xff\xfe not UTF-8".b
    ]
  end

  Herald::CableTestSupport::STORES.each do |kind|
    define_method(:"test_payloads_arrive_byte_for_byte_on_#{kind}") do
      # A 10 MB record takes Redis over its 1 s default timeout on a loaded machine (cable.yml passes it on).
      rx, tx = (kind == :log) ? adapters(kind) : adapters(kind, timeout: 20)
      queue = subscribed_queue(rx, "bytes ✓")
      sent = payloads
      sent.each { |payload| tx.broadcast("bytes ✓", payload) }
      received = sent.map { pop(queue, timeout: 30) }
      sent.zip(received).each_with_index do |(want, got), i|
        assert_equal want.b, got.b, "payload #{i} (#{want.bytesize} bytes) changed"
        assert_equal (want.b.force_encoding(Encoding::UTF_8).valid_encoding? ? Encoding::UTF_8 : Encoding::BINARY), got.encoding
      end
      assert_equal [10 << 20, 1 << 20], received.map(&:bytesize).max(2)
    end

    # Broadcastings never mix with message_bus channels or events of the same name, and ActionCable's
    # instrumentation fires along with Herald's.
    define_method(:"test_broadcasts_stay_in_their_namespace_on_#{kind}") do
      rx, tx = adapters(kind, max_backlog_size: 5)
      queue = subscribed_queue(rx, "/chat")
      bus = Herald::Bus.new(store: Herald::Store.from_url(store_setting(kind)))
      before = bus.last_id("/chat")
      bus.publish("/chat", {"from" => "message_bus"})
      7.times do |i|
        tx.broadcast("/chat", "cable #{i}")
        assert_equal "cable #{i}", pop(queue) # one at a time: a burst past max_backlog_size may be cut (below)
      end
      assert_equal before + 1, bus.last_id("/chat"), "message_bus's /chat got no broadcast"
      cable = bus.backlog(Herald::Cable.channel("/chat"), 0)
      assert_equal ["cable 2", "cable 3", "cable 4", "cable 5", "cable 6"], cable.map { |m| m.data }.last(5)
      assert_operator cable.size, :<=, 5, "max_backlog_size from cable.yml is the channel's retention"
    ensure
      bus&.close
    end
  end

  # A burst on one broadcasting beyond its retention, faster than the reader: what the reader finds
  # trimmed is missing, and every missing broadcast is named in a warning; the rest arrive in order, once.
  def test_broadcasts_trimmed_before_they_were_read_are_logged
    log = StringIO.new
    Herald.logger = Logger.new(log)
    rx, tx = adapters(:log, max_backlog_size: 2)
    queue = subscribed_queue(rx, "burst")
    sent = Array.new(300) { |i| "b#{i}" }
    sent.each { |payload| tx.broadcast("burst", payload) }
    tx.broadcast("burst", "last")
    got = []
    got << pop(queue) until got.last == "last"
    got.pop
    assert_equal got.uniq, got
    assert_equal got, got.sort_by { |p| p[1..].to_i }, "in order"
    warned = log.string.scan(/(\d+) broadcast\(s\) on #{Regexp.escape(Herald::Cable.channel("burst"))} were not read/).sum { |(n)| n.to_i }
    assert_equal sent.size - got.size, warned, "every missing broadcast is logged (#{got.size} of #{sent.size} arrived)"
  ensure
    Herald.logger = nil
  end

  def test_long_and_odd_broadcasting_names_have_channels_of_their_own
    long = "x" * 5000
    names = ["a", long, "#{long}y", "\xff".b, "a$|$b", "#sha256:#{"0" * 64}", "ünï ✓"]
    channels = names.map { |n| Herald::Cable.channel(n) }
    assert_equal channels.size, channels.uniq.size
    channels.each do |c|
      assert Herald::Cable.channel?(c)
      assert_operator c.bytesize, :<=, Herald::Store::MAX_CHANNEL_BYTES
      assert c.valid_encoding?
    end
    rx, tx = adapters(:log)
    queues = names.map { |n| subscribed_queue(rx, n) }
    names.each_with_index { |n, i| tx.broadcast(n, "to #{i}") }
    assert_equal Array.new(names.size) { |i| "to #{i}" }, queues.map { |q| pop(q) }
  end

  def test_instrumentation_of_rails_and_of_herald_fire
    server = cable_server(store: store_setting(:log))
    events = Queue.new
    subs = %w[broadcast.action_cable publish_message.herald].map do |name|
      ActiveSupport::Notifications.subscribe(name) { |*, payload| events << [name, payload[:broadcasting] || payload[:channel]] }
    end
    queue = subscribed_queue(server.pubsub, "room")
    server.broadcast("room", {"text" => "hi ✓"})
    assert_equal({"text" => "hi ✓"}, JSON.parse(pop(queue)))
    seen = Array.new(2) { events.pop }.sort
    assert_equal [["broadcast.action_cable", "room"], ["publish_message.herald", Herald::Cable.channel("room")]], seen
  ensure
    subs&.each { |s| ActiveSupport::Notifications.unsubscribe(s) }
    server&.pubsub&.shutdown
  end

  def test_settings_are_checked
    assert_raises(Herald::ConfigurationError) { adapters(:log, url: "redis://localhost") }
    assert_raises(Herald::ConfigurationError) { adapters(:log, max_backlog_size: 0) }
    assert_raises(Herald::ConfigurationError) { adapters(:log, max_backlog_age: "1 day") }
    assert_raises(Herald::ConfigurationError) { cable_server(timeout: 5).pubsub }
    error = assert_raises(Herald::ConfigurationError) { adapters(:log, nonsense: 1).first.broadcast("a", "b") }
    assert_includes error.message, "nonsense"
  end

  # Without `store:`, the app's Herald store (Herald.configure) carries the broadcasts, and shutting the
  # adapter down leaves it open for the app.
  def test_the_apps_herald_store_by_default
    Herald.reset!
    store = Herald::Store::Memory.new
    Herald.configure { |c| c.store = store }
    server = cable_server
    queue = subscribed_queue(server.pubsub, "room")
    server.pubsub.broadcast("room", "hi")
    assert_equal "hi", pop(queue)
    assert_equal 1, store.last_id(Herald::Cable.channel("room"))
    server.pubsub.shutdown
    assert_equal 1, Herald.bus.store.last_global_id, "the app's store stays open"
  ensure
    Herald.reset!
  end
end
