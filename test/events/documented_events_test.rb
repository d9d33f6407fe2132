# frozen_string_literal: true

# Every event docs/instrumentation.md lists is seen by a listener, with exactly the keys it lists: through
# ActiveSupport::Notifications (loaded) and through Herald::Instrumentation's callbacks (not loaded). Each
# runs in a fresh Ruby (this file, run as a script) so that "ActiveSupport is not loaded" really holds.
if $PROGRAM_NAME == __FILE__ && ENV["HERALD_EVENTS_CHILD"]
  if ENV["HERALD_EVENTS_CHILD"] == "as"
    require "active_support"
    require "active_support/notifications"
  end
  require "herald"
  require "json"
  require "rack"
  require "rack/mock"
  require "tmpdir"

  seen = Queue.new
  if defined?(ActiveSupport::Notifications)
    ActiveSupport::Notifications.subscribe(/\.herald\z/) { |event| seen << [event.name, event.payload.keys.map(&:to_s).sort] }
  else
    Herald::Instrumentation.subscribe { |name, payload, _| seen << [name, payload.keys.map(&:to_s).sort] }
  end
  wait_for = lambda do |name|
    got = []
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    until got.any? { |n, _| n == name } || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      seen.empty? ? sleep(0.01) : got << seen.pop # (Queue#pop(timeout:) is Ruby 3.2's)
    end
    got
  end

  Dir.mktmpdir do |dir|
    Herald.configure { |c| c.store = Herald::Store::Log.new(dir: dir, fsync: :never) }
    bus = Herald.bus
    mw = Herald::Rack::Middleware.new(->(_) { [404, {}, []] }, bus: bus, long_polling_interval: 5)
    mock = Rack::MockRequest.new(mw)
    form = {"CONTENT_TYPE" => "application/x-www-form-urlencoded"}
    bus.publish("/a", {"text" => "héllo 👋", "nul" => "a\u0000b"}, user_ids: [1])
    mock.post("/message-bus/c1/poll?dlp=t", form.merge(input: "/a=0"))
    parked = Thread.new { mock.post("/message-bus/c2/poll", form.merge(:input => "/b=0", "HTTP_DONT_CHUNK" => "t")) }
    sleep 0.01 until mw.active_clients == 1
    bus.publish("/b", "")
    parked.join
    ok = Class.new { include Herald::Subscriber }
    ok.subscriber_name("Fine")
    ok.define_method(:call) { |_event, _msg| nil }
    ok.deferred(start: :oldest)
    ok.subscribe_to("/ev")
    bad = Class.new { include Herald::Subscriber }
    bad.subscriber_name("Broken")
    bad.define_method(:call) { |_event, _msg| raise KeyError, "nope ü" }
    bad.retry_on(StandardError, attempts: 2, wait: 0.001)
    bad.deferred(start: :oldest)
    bad.subscribe_to("/ev")
    Herald.logger = Logger.new(File::NULL)
    Herald.start_workers
    Herald.publish_event({"n" => 1}, channel: "/ev")
    events = wait_for.call("dead.herald")
    Herald.shutdown(timeout: 2)
    mw.close
    events << seen.pop until seen.empty?
    puts JSON.generate(loaded: !!defined?(ActiveSupport::Notifications), events: events.uniq)
  end
  $stdout.flush
  exit!(0) # no minitest in the child
end

require_relative "../test_helper"
require "open3"
require "json"

class DocumentedEventsTest < Minitest::Test
  DOC = File.expand_path("../../docs/instrumentation.md", __dir__)

  # {event => [keys, keys also when the block raised]} from the doc's table.
  def documented
    File.readlines(DOC).grep(/\A\| `[a-z_]+\.herald` \|/).to_h do |row|
      name, keys, raised = row.split("|").map(&:strip).reject(&:empty?)
      [name.delete("`"), [keys.scan(/`(\w+)`/).flatten.sort, raised.to_s.scan(/`(\w+)`/).flatten.sort]]
    end
  end

  def run_child(mode)
    out, status = Open3.capture2e({"HERALD_EVENTS_CHILD" => mode}, RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), __FILE__)
    assert status.success?, out
    JSON.parse(out.lines.last)
  end

  def assert_documented_events(result)
    doc = documented
    assert_equal %w[dead.herald deliver.herald poll.herald process.herald publish.herald publish_message.herald retry.herald], doc.keys.sort
    seen = result["events"].group_by(&:first).transform_values { |list| list.map(&:last) }
    assert_equal doc.keys.sort, seen.keys.sort, "every documented event was seen, and no other"
    doc.each do |name, (keys, raised)|
      assert_includes seen[name], keys, "#{name} with exactly the documented keys"
      seen[name].each { |got| assert_includes [keys, (keys + raised).sort], got, "#{name}: an undocumented key" }
    end
    # The handler that raised: process.herald carried the exception keys documented for it.
    assert_includes seen["process.herald"], (doc["process.herald"][0] + doc["process.herald"][1]).sort
  end

  def test_through_active_support_notifications
    result = run_child("as")
    assert result["loaded"]
    assert_documented_events(result)
  end

  def test_through_herald_callbacks_without_active_support
    result = run_child("callbacks")
    refute result["loaded"]
    assert_documented_events(result)
  end
end
