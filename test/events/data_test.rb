# frozen_string_literal: true

require_relative "events_helper"
require_relative "../support/real_data"

# Every byte comes back through events: the data users send (RealData: accents, CJK, emoji and ZWJ
# sequences, NUL, empty and 1 MiB values, binary) through sync and deferred subscribers, dead letters and
# their replay, with the same bytes and the same encoding. A failed handler is logged through Herald.logger.
# Included once per store; test/events/networked_stores_test.rb includes it for Redis and PostgreSQL.
module EventDataTests
  include Herald::EventsTestSupport
  include RealData

  # An event class with a text and a binary field.
  Sample = Struct.new(:label, :value)

  CHANNEL = "/événements/👋"
  REFUSED = "carte refusée 💳"

  def samples = (TEXTS + BINARY).each_with_index.map { |v, i| Sample.new("#{i}: #{v.encoding}", v) }

  def test_events_reach_sync_and_deferred_subscribers_byte_for_byte
    use_store(new_store)
    sync = []
    deferred = Queue.new
    define_subscriber("Sync", Sample) { |e, _m| sync << e }
    define_subscriber("Deferred", Sample, deferred: true) { |e, _m| deferred << e }
    sent = samples
    sent.each { |e| Herald.publish_event(e) }
    assert_same_events sent, sync, "sync"
    assert_same_events sent, Array.new(sent.size) { Timeout.timeout(10) { deferred.pop } }, "deferred"
  end

  def test_json_and_msgpack_messages_reach_a_deferred_channel_subscriber_byte_for_byte
    use_store(new_store)
    got = Queue.new
    define_subscriber("Chan", CHANNEL, deferred: true, start: :oldest) { |e, m| got << [e, m.codec.name] }
    json = Herald::Bus.new(store: Herald.bus.store, codec: :json)
    msgpack = Herald::Bus.new(store: Herald.bus.store, codec: :msgpack)
    sent = TEXTS.map { |t| [{"text" => t, "ü" => [t]}, :json] } + BINARY.map { |b| [{"blob" => b}, :msgpack] }
    sent.each { |data, codec| ((codec == :json) ? json : msgpack).publish(CHANNEL, data) }
    Herald.start_workers
    received = Array.new(sent.size) { Timeout.timeout(10) { got.pop } }
    assert_equal sent.map(&:last), received.map(&:last)
    sent.zip(received).each_with_index do |((data, _), (back, _)), i|
      data.each { |k, v| assert_same_string Array(v).first, Array(back[k]).first, "message #{i} #{k}" }
    end
  end

  def test_dead_letters_of_json_and_msgpack_messages_keep_their_payload_bytes_and_encoding
    use_store(new_store)
    json = Herald::Bus.new(store: Herald.bus.store, codec: :json)
    msgpack = Herald::Bus.new(store: Herald.bus.store, codec: :msgpack)
    define_subscriber("Drop", CHANNEL, deferred: true, start: :oldest) { |_e, _m| raise REFUSED }
    capture_log do |io|
      TEXTS.each { |t| json.publish(CHANNEL, {"text" => t}) }
      BINARY.each { |b| msgpack.publish(CHANNEL, [b, "ü"]) }
      Herald.start_workers
      eventually(timeout: 10) { io.string.scan("gave up on").size == TEXTS.size + BINARY.size }
    end
    originals = Herald.bus.store.backlog(CHANNEL, 0)
    letters = Herald.dead_letters.list("Drop")
    assert_equal originals.map(&:global_id), letters.map(&:global_id)
    originals.zip(letters.map(&:message)) do |sent, back|
      assert_equal [sent.codec, sent.payload.encoding, sent.message_id], [back.codec, back.payload.encoding, back.message_id]
      assert_equal sent, back, "same ids, channel and payload bytes"
      assert_equal sent.data, back.data
    end
  end

  # The issue's case: a deferred subscriber that publishes "josé" failed on the Log store, was retried
  # three times (repeating its side effects) and landed in the dead letters with nothing logged.
  def test_a_deferred_subscriber_can_publish_non_ascii_text
    use_store(new_store)
    define_subscriber("Greeter", Sample, deferred: true, retry_on: {attempts: 3, wait: 0.01}) do |e, _m|
      Herald.publish("/greetings/👋", {"name" => "josé", "from" => e.value})
    end
    log = capture_log do
      Herald.publish_event(Sample.new("x", "漢字 👩‍👩‍👧‍👦"))
      eventually { Herald.backlog("/greetings/👋", 0).size == 1 }
      sleep 0.05
    end
    assert_equal({"name" => "josé", "from" => "漢字 👩‍👩‍👧‍👦"}, Herald.backlog("/greetings/👋", 0).first.data)
    assert_empty Herald.dead_letters.list
    assert_empty log.lines.grep(/Greeter/), "no failure logged"
  end

  def test_dead_letters_keep_every_byte_and_replay_gives_the_handler_the_same_event
    use_store(new_store)
    fixed = false
    replayed = []
    sub = define_subscriber("Refuser", Sample, CHANNEL, deferred: true, retry_on: {attempts: 2, wait: 0.001}) do |e, m|
      raise ArgumentError, "#{REFUSED} #{e.label}" unless fixed
      replayed << [e, m]
    end
    sent = samples
    log = capture_log do |io|
      sent.each { |e| Herald.publish_event(e, channel: CHANNEL) }
      eventually(timeout: 10) { io.string.scan("gave up on").size == sent.size }
    end
    letters = Herald.dead_letters.list("Refuser")
    assert_equal [CHANNEL], letters.map(&:channel).uniq
    assert_equal sent.map { |e| "#{REFUSED} #{e.label}" }, letters.map(&:error_message)
    letters.each { |l| assert_equal Encoding::UTF_8, l.error_message.encoding }
    assert_same_events sent, letters.map { |l| l.message.data }, "dead letter"
    assert_equal letters.map(&:global_id), letters.map { |l| l.message.global_id }
    letters.each { |l| assert_equal Encoding::BINARY, l.message.payload.encoding }

    assert_equal sent.size, log.scan(/^WARN: deferred subscriber Refuser failed on .*, retrying/).size, log[0, 2000]
    gave_up = log.scan(/^ERROR: deferred subscriber Refuser gave up on (.*) #(\d+) after 2 attempts: ArgumentError: (.*)$/)
    assert_equal sent.size, gave_up.size, log[0, 2000]
    assert_equal [CHANNEL], gave_up.map(&:first).uniq
    assert_includes gave_up.first.last, "#{REFUSED} #{sent.first.label}"

    fixed = true
    results = Herald.dead_letters.replay(sub)
    assert_equal [nil], results.map(&:last).uniq
    assert_same_events sent, replayed.map(&:first), "replayed"
    assert_equal letters.map(&:global_id), replayed.map { |_, m| m.global_id }
    assert_equal [CHANNEL], replayed.map { |_, m| m.channel }.uniq
  end

  # Error messages are for people: whatever bytes an exception carries, the dead letter and the log line
  # hold readable UTF-8, and nothing raises on the way (a binary message next to a non-ASCII channel name
  # used to be an Encoding::CompatibilityError waiting to happen).
  def test_error_messages_in_any_encoding_are_kept_readable
    use_store(new_store)
    messages = ["\xFF\xFEbinary é".b, (+"invalid \xC3 utf-8").force_encoding("UTF-8"), (+"latin1 \xE9").force_encoding("ISO-8859-1"), "", "\u0000nul"]
    define_subscriber("Odd", Sample, CHANNEL, deferred: true) { |e, _m| raise messages[Integer(e.label)] }
    log = capture_log do |io|
      messages.each_index { |i| Herald.publish_event(Sample.new(i.to_s, "v"), channel: CHANNEL) }
      eventually { io.string.scan("gave up on").size == messages.size }
    end
    got = Herald.dead_letters.list("Odd").map(&:error_message)
    got.each { |m| assert m.valid_encoding? && m.encoding == Encoding::UTF_8, m.inspect }
    assert_equal ["\uFFFD\uFFFDbinary é", "invalid \uFFFD utf-8", "latin1 é", "", "\u0000nul"], got
    assert_equal messages.size, log.scan("gave up on").size
  end

  private

  def assert_same_events(sent, got, where)
    assert_equal sent.size, got.size, where
    sent.zip(got).each do |s, g|
      assert_instance_of Sample, g, where
      assert_same_string s.label, g.label, where
      assert_same_string s.value, g.value, "#{where}: #{s.label}"
    end
  end

  # Same bytes, and binary stays binary while text stays UTF-8.
  def assert_same_string(sent, got, where)
    assert_instance_of String, got, where
    assert_equal sent.bytesize, got.bytesize, where
    assert sent.b == got.b, "#{where}: bytes differ"
    expected = (sent.encoding == Encoding::BINARY) ? Encoding::BINARY : Encoding::UTF_8
    assert_equal expected, got.encoding, where
  end
end

class LogEventDataTest < Minitest::Test
  include EventDataTests

  def new_store = log_store(File.join(@tmp, "log"), fsync: :always)

  # `herald dead` lists what the handler refused (non-ASCII channel and error message), `herald replay`
  # hands the app's handler every event back byte for byte, in another process, after a reopen.
  def test_herald_dead_and_herald_replay_carry_every_byte
    dir = File.join(@tmp, "cli")
    use_store(log_store(dir))
    require_relative "fixtures/data_app"
    ENV["REPLAY_OUT"] = File.join(@tmp, "missing", "out") # no such directory: every call fails
    sent = samples.map { |s| DataEvent.new(s.label, s.value) }
    capture_log do |io|
      sent.each { |e| Herald.publish_event(e, channel: CHANNEL) }
      eventually(timeout: 10) { io.string.scan("gave up on").size == sent.size }
    end
    Herald.reset!

    out, status = herald("dead", "--dir", dir)
    assert status.success?, out
    lines = out.force_encoding(Encoding::UTF_8).lines
    assert_equal sent.size + 1, lines.size, out[0, 2000]
    assert_match(%r{\ARecordData #1: /événements/👋 global_id=1 after 1 attempts: Errno::ENOENT: No such file or directory}, lines.first)
    assert_equal "#{sent.size} dead letters\n", lines.last

    replay_out = File.join(@tmp, "replayed")
    fixture = File.expand_path("fixtures/data_app.rb", __dir__)
    out, status = herald("replay", "RecordData", "-r", fixture, "--dir", dir, env: {"REPLAY_OUT" => replay_out})
    assert status.success?, out
    assert_match(/#{sent.size} replayed, 0 failed/, out)
    got = File.open(replay_out, "rb") { |f| Array.new(sent.size) { Marshal.load(f) }.tap { assert f.eof? } }
    assert_equal lines[0..-2].map { |l| Integer(l[/global_id=(\d+)/, 1]) }, got.map(&:first), "the original messages' ids"
    assert_equal [CHANNEL], got.map { |g| g[1] }.uniq
    sent.zip(got) do |e, (_, _, (label, value))|
      assert_same_string e.label, label, "replayed label"
      assert_same_string e.value, value, "replayed #{e.label}"
    end
  ensure
    ENV.delete("REPLAY_OUT")
  end
end

class MemoryEventDataTest < Minitest::Test
  include EventDataTests

  def new_store = Herald::Store::Memory.new
end
