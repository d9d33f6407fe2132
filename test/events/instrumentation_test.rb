# frozen_string_literal: true

require_relative "events_helper"
require "open3"
require "json"

# publish/process/retry/dead.herald, through plain callbacks and through ActiveSupport::Notifications.
# Each case runs in a fresh Ruby so "ActiveSupport is not loaded" really holds.
class InstrumentationTest < Minitest::Test
  include Herald::EventsTestSupport

  SCRIPT = <<~RUBY
    require "herald"
    require "tmpdir"
    require "json"
    if ENV["WITH_AS"] == "1"
      require "active_support"
      require "active_support/notifications"
    end
    Ev = Struct.new(:n)
    seen = Queue.new
    if ENV["WITH_AS"] == "1"
      %w[publish.herald process.herald retry.herald dead.herald].each do |name|
        ActiveSupport::Notifications.subscribe(name) { |*, payload| seen << ["as", name, payload[:attempt] || payload[:attempts], payload[:error]&.class&.name] }
      end
    end
    Herald::Instrumentation.subscribe do |name, payload, duration|
      seen << ["cb", name, payload[:attempt] || payload[:attempts], (payload[:error] || payload[:exception_object])&.class&.name, duration.nil? ? nil : duration >= 0]
    end
    class Failing
      include Herald::Subscriber
      subscribe_to Ev
      deferred
      retry_on StandardError, attempts: 2, wait: 0.001
      def call(event, message) = raise(KeyError, "nope")
    end
    Herald.configure { |c| c.store = Herald::Store::Log.new(dir: Dir.mktmpdir, fsync: :never) }
    Herald.publish_event(Ev.new(1))
    out = []
    loop do
      out << seen.pop
      # publish.herald is reported when publish_event returns, which may be after the worker is done.
      listeners = ENV["WITH_AS"] == "1" ? 2 : 1
      break if %w[dead.herald publish.herald].all? { |n| out.count { |e| e[1] == n } == listeners }
    end
    Herald.shutdown(timeout: 1)
    puts JSON.generate(loaded: !!defined?(ActiveSupport), events: out)
  RUBY

  def run_script(with_as:)
    lib = File.expand_path("../../lib", __dir__)
    out, status = Open3.capture2e({"WITH_AS" => with_as ? "1" : "0"}, RbConfig.ruby, "-I", lib, "-e", SCRIPT)
    assert status.success?, out
    JSON.parse(out.lines.last)
  end

  def test_plain_callbacks_without_active_support
    result = run_script(with_as: false)
    refute result["loaded"], "ActiveSupport stayed unloaded"
    # publish.herald is reported when publish_event returns; the worker thread may have started by then.
    published, worked = result["events"].partition { |e| e[1] == "publish.herald" }
    assert_equal [["cb", "publish.herald", nil, nil, true]], published
    assert_equal [["cb", "process.herald", 1, "KeyError", true], ["cb", "retry.herald", 1, "KeyError", nil],
      ["cb", "process.herald", 2, "KeyError", true], ["cb", "dead.herald", 2, "KeyError", nil]], worked
  end

  def test_active_support_notifications_when_loaded
    result = run_script(with_as: true)
    assert result["loaded"]
    as = result["events"].select { |e| e[0] == "as" }.map { |e| e[1] }
    assert_equal 1, as.count("publish.herald")
    assert_equal %w[process.herald retry.herald process.herald dead.herald], as - ["publish.herald"]
    cb = result["events"].select { |e| e[0] == "cb" }.map { |e| e[1] }
    assert_equal as.sort, cb.sort, "callbacks still get them"
  end

  def test_a_failing_callback_never_breaks_publishing
    use_store(Herald::Store::Memory.new)
    sub = Herald::Instrumentation.subscribe("publish.herald") { raise "broken listener" }
    _, err = capture_io { assert_equal 1, Herald.publish_event(UserRegistered.new(user_id: 1)) }
    assert_match(/broken listener/, err)
  ensure
    Herald::Instrumentation.unsubscribe(sub)
  end

  # listening? is asked on every poll and keeps what it found out: ActiveSupport loaded after polls were
  # answered (from the reply cache, which skips instrumented polls), and subscribers added after that on
  # either side, must still get the next poll's event; once they are gone, polls are cached again.
  LATE_SCRIPT = <<~RUBY
    require "herald"
    require "stringio"
    require "json"
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    bus.publish("/c", "x")
    mw = Herald::Rack::Middleware.new(->(_env) { [404, {}, []] }, bus: bus)
    poll = lambda do
      env = {"REQUEST_METHOD" => "POST", "PATH_INFO" => "/message-bus/abc/poll", "QUERY_STRING" => "dlp=t",
        "SERVER_PROTOCOL" => "HTTP/1.1", "CONTENT_TYPE" => "application/x-www-form-urlencoded", "rack.input" => StringIO.new("/c=0")}
      status, _, body = mw.call(env)
      raise "poll answered \#{status} \#{body.join}" unless status == 200 && JSON.parse(body.join).size == 1
    end
    seen = []
    steps = {"unloaded" => Herald::Instrumentation.listening?("poll.herald")}
    3.times { poll.call } # answered from the reply cache: nobody listens
    require "active_support"
    require "active_support/notifications"
    poll.call # loaded, nobody listens yet
    ActiveSupport::Notifications.subscribe("poll.herald") { |*, payload| seen << ["as", payload[:messages]] }
    poll.call
    sub = Herald::Instrumentation.subscribe("poll.herald") { |_name, payload, _| seen << ["cb", payload[:messages]] }
    poll.call
    Herald::Instrumentation.unsubscribe(sub)
    ActiveSupport::Notifications.unsubscribe("poll.herald")
    poll.call
    steps["listening after unsubscribing"] = Herald::Instrumentation.listening?("poll.herald")
    puts JSON.generate(steps: steps, seen: seen)
  RUBY

  def test_active_support_loaded_and_subscribed_late_still_sees_polls
    lib = File.expand_path("../../lib", __dir__)
    out, status = Open3.capture2e(RbConfig.ruby, "-I", lib, "-e", LATE_SCRIPT)
    assert status.success?, out
    result = JSON.parse(out.lines.last)
    assert_equal({"unloaded" => false, "listening after unsubscribing" => false}, result["steps"])
    assert_equal [["as", 1], ["as", 1], ["cb", 1]], result["seen"]
  end
end
