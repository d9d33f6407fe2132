# frozen_string_literal: true

require_relative "events_helper"

# Declaring subscribers, event channels, and synchronous delivery inside publish_event.
class SubscriberTest < Minitest::Test
  include Herald::EventsTestSupport

  def test_channel_is_derived_from_the_class_name
    assert_equal "/events/herald/events_test_support/user_registered", Herald::Events.channel_for(UserRegistered)
    assert_equal "/events/http_request", Herald::Events.channel_for(Class.new.tap { |c| def c.name = "HTTPRequest" })
  end

  def test_publish_event_returns_the_message_id_and_stores_the_event
    use_store(Herald::Store::Memory.new)
    assert_equal 1, Herald.publish_event(UserRegistered.new(user_id: 1))
    assert_equal 2, Herald.publish_event(UserRegistered.new(user_id: 2))
    assert_equal 1, Herald.publish_event({"order" => 5}, channel: "/orders")
    msgs = Herald.global_backlog(0)
    assert_equal [UserRegistered.new(user_id: 1), UserRegistered.new(user_id: 2), {"order" => 5}], msgs.map(&:data)
    assert_equal Herald::Events.channel_for(UserRegistered), msgs.first.channel
  end

  def test_sync_subscribers_run_inside_publish_for_the_class_its_subclasses_and_channels
    use_store(Herald::Store::Memory.new)
    seen = []
    define_subscriber("ByClass", UserRegistered) { |e, m| seen << [:cls, e, m.global_id] }
    define_subscriber("ByChannel", "/orders") { |e, _m| seen << [:chan, e] }
    define_subscriber("Other", OrderPlaced) { |e, _m| seen << [:other, e] }
    Herald.publish_event(UserRegistered.new(user_id: 1))
    Herald.publish_event(PremiumRegistered.new(user_id: 2))
    Herald.publish_event({"id" => 3}, channel: "/orders")
    assert_equal [[:cls, UserRegistered.new(user_id: 1), 1], [:cls, PremiumRegistered.new(user_id: 2), 2], [:chan, {"id" => 3}]], seen
  end

  # Decision: a synchronous subscriber's exception propagates out of publish_event. The event is stored
  # first, so deferred subscribers still get it; sync subscribers after the failing one do not run.
  def test_sync_subscriber_exception_propagates_after_the_event_is_stored
    use_store(Herald::Store::Memory.new)
    ran = []
    define_subscriber("First", UserRegistered) { |_e, _m| ran << :first }
    define_subscriber("Failing", UserRegistered) { |_e, _m| raise ArgumentError, "bad user" }
    define_subscriber("Last", UserRegistered) { |_e, _m| ran << :last }
    error = assert_raises(ArgumentError) { Herald.publish_event(UserRegistered.new(user_id: 1)) }
    assert_equal "bad user", error.message
    assert_equal [:first], ran
    assert_equal 1, Herald.last_id(Herald::Events.channel_for(UserRegistered)), "the event is stored"
  end

  def test_declaration_errors_are_named
    assert_raises(Herald::SubscriberError) { Class.new { include Herald::Subscriber }.subscribe_to("") }
    assert_raises(Herald::SubscriberError) { Class.new { include Herald::Subscriber }.subscriber_name }
    assert_raises(Herald::SubscriberError) { Class.new { include Herald::Subscriber }.retry_on(attempts: 0) }
  end

  # Event channels follow Bus#publish's rules: any non-empty UTF-8 name (as message_bus), checked the same way.
  def test_event_channels_take_the_names_publish_takes
    use_store(Herald::Store::Memory.new) # the store that keeps a name's encoding as given
    got = []
    define_subscriber("NoSlash", "orders") { |e, _m| got << e }
    Herald.publish_event({"n" => "é"}, channel: "orders")
    assert_equal [{"n" => "é"}], got
    Herald.publish_event({"n" => 2}, channel: "orders".b) # an ASCII name from a Rack env: stored as UTF-8, as publish does
    assert_equal [Encoding::UTF_8], Herald.backlog("orders").map { |m| m.channel.encoding }.uniq
    assert_raises(Herald::InvalidMessageError) { Herald.publish_event({}, channel: "") }
    assert_raises(Herald::InvalidMessageError) { Herald.publish_event({}, channel: "bad\xFF") }
  end

  def test_retry_backoff_is_exponential_and_capped
    policy = define_subscriber("R", "/x", retry_on: {attempts: 5, wait: 0.5, max_wait: 3}) {}.retry_policy
    assert_equal [0.5, 1.0, 2.0, 3], (1..4).map { |a| policy.delay(a) }
    assert policy.retry?(RuntimeError.new, 4)
    refute policy.retry?(RuntimeError.new, 5)
  end
end
