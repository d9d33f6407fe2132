# frozen_string_literal: true

require "test_helper"
require "herald/test_helper"

# Herald::TestHelper#perform_published_events (Events::InlineRunner): deferred subscribers run on the
# test's thread on request, as ActiveJob's perform_enqueued_jobs; never in the background during a test.
class InlineRunnerTest < Minitest::Test
  include Herald::TestHelper

  Signup = Struct.new(:email, keyword_init: true)
  VipSignup = Class.new(Signup)
  TEXT = "josé 日本語 🎉 \u0000"

  def setup
    @seen = []
    Herald::Events.registry.clear
  end

  def teardown
    Herald.reset!
    Herald::Events.registry.clear
  end

  def subscriber(name, *targets, deferred: true, &call)
    seen = @seen
    later = deferred
    Class.new do
      include Herald::Subscriber

      subscriber_name name
      deferred(later)
      subscribe_to(*targets)
      define_method(:call) { |event, msg| seen << [name, event, msg.channel, Thread.current] && call&.call(event, msg) }
    end
  end

  def test_deferred_subscribers_run_inline_on_what_the_block_published
    subscriber("Welcome", Signup)
    subscriber("Orders", "/orders")
    subscriber("Sync", Signup, deferred: false)
    Herald.publish_event(Signup.new(email: "before@x")) # before the block: not this call's
    @seen.clear # the sync subscriber's call
    result = perform_published_events do
      Herald.publish_event(VipSignup.new(email: TEXT))
      Herald.publish("/orders", {"text" => TEXT})
      Herald.publish("/other", {"n" => 1})
      assert_equal [], @seen.reject { |s| s.first == "Sync" }, "nothing deferred runs inside the block"
      :value
    end
    assert_equal :value, result
    deferred = @seen.reject { |s| s.first == "Sync" }
    assert_equal [["Welcome", VipSignup.new(email: TEXT), Herald::Events.channel_for(VipSignup)], ["Orders", {"text" => TEXT}, "/orders"]],
      deferred.map { |s| s.first(3) }
    assert deferred.all? { |s| s.last == Thread.current }, "on the test's thread"
    refute Herald::Events.runtime.running?, "no workers started"
  end

  def test_without_a_block_it_runs_everything_not_yet_performed_once
    subscriber("Welcome", Signup)
    Herald.publish_event(Signup.new(email: "1"))
    Herald.publish_event(Signup.new(email: "2"))
    sleep 0.1
    assert_empty @seen, "deferred subscribers never run by themselves in a test"
    perform_published_events
    perform_published_events { Herald.publish_event(Signup.new(email: "3")) }
    perform_published_events
    assert_equal %w[1 2 3], @seen.map { |s| s[1].email }
  end

  def test_what_handlers_publish_is_handled_in_turn_and_errors_propagate
    subscriber("Chain", Signup) { |e, _| Herald.publish("/welcomed", {"email" => e.email}) }
    subscriber("Audit", "/welcomed")
    perform_published_events { Herald.publish_event(Signup.new(email: TEXT)) }
    assert_equal ["Chain", "Audit"], @seen.map(&:first)
    assert_equal({"email" => TEXT}, @seen.last[1])

    subscriber("Failing", "/fail") { raise ArgumentError, "ü failed" }
    error = assert_raises(ArgumentError) { perform_published_events { Herald.publish("/fail", 1) } }
    assert_equal "ü failed", error.message
    assert_empty Herald.dead_letters.list, "no dead letters in a test"

    subscriber("Loop", "/loop") { Herald.publish("/loop", 1) }
    assert_raises(Herald::SubscriberError) { perform_published_events { Herald.publish("/loop", 0) } }
  end

  # The process's autostart setting is the test's to change only while it runs.
  def test_autostart_is_off_during_a_test_and_restored_after
    refute Herald::Events.autostart
    helper = Class.new(Minitest::Test) { include Herald::TestHelper }.new("x")
    Herald::Events.autostart = :before
    helper.before_setup
    refute Herald::Events.autostart
    helper.after_teardown
    assert_equal :before, Herald::Events.autostart
  ensure
    Herald::Events.autostart = false
  end
end
