# frozen_string_literal: true

require_relative "events_helper"

# Where a deferred subscriber seen for the first time (no saved cursor) begins: after what the store
# held when its workers started (`start: :now`, the default), or at the oldest retained event
# (`deferred start: :oldest`). Once it has a cursor, it resumes there, whatever the option.
class StartTest < Minitest::Test
  include Herald::EventsTestSupport

  STORES = {memory: -> { Herald::Store::Memory.new }, log: -> { log_store }}.freeze

  STORES.each do |kind, build|
    define_method(:"test_a_new_subscriber_handles_only_later_events_on_#{kind}") do
      store = use_store(instance_exec(&build))
      publish_numbers(1..7)
      got = Queue.new
      define_subscriber("New", Numbered, deferred: true) { |e, _m| got << e.n }
      Herald.start_workers
      publish_numbers(8..10)
      assert_equal [8, 9, 10], Array.new(3) { Timeout.timeout(5) { got.pop } }
      eventually { store.load_cursor("New") == 10 }
      assert got.empty?, "nothing from before it existed: #{got.size} more"
    end

    define_method(:"test_start_oldest_replays_every_retained_event_on_#{kind}") do
      use_store(instance_exec(&build))
      publish_numbers(1..7)
      got = Queue.new
      define_subscriber("Backfill", Numbered, deferred: true, start: :oldest) { |e, _m| got << e.n }
      Herald.start_workers
      publish_numbers(8..10)
      assert_equal (1..10).to_a, Array.new(10) { Timeout.timeout(5) { got.pop } }
    end
  end

  # The issue's case: a failing subscriber added to an app with history dead-lettered every old event.
  def test_a_failing_new_subscriber_does_not_turn_old_events_into_dead_letters
    use_store(log_store)
    publish_numbers(1..20)
    define_subscriber("Failing", Numbered, deferred: true) { |_e, _m| raise ArgumentError, "ünïcode 💥" }
    capture_log do |io|
      Herald.start_workers
      publish_numbers(21..22)
      eventually { io.string.scan("gave up on").size == 2 }
      sleep 0.2
    end
    letters = Herald.dead_letters.list("Failing")
    assert_equal [21, 22], letters.map { |l| l.message.data.n }
  end

  # The start is saved when the subscriber first runs: a restart with events published while it was down
  # resumes after that cursor (they are handled), not at a new "now".
  def test_the_first_cursor_is_saved_at_once_so_a_restart_resumes_there
    dir = File.join(@tmp, "restart")
    use_store(log_store(dir))
    publish_numbers(1..5)
    got = Queue.new
    define_subscriber("Resumer", Numbered, deferred: true) { |e, _m| got << e.n }
    Herald.start_workers
    eventually { Herald.bus.store.load_cursor("Resumer", default: nil) == 5 }
    Herald.reset! # stops the workers before anything new came
    use_store(log_store(dir))
    publish_numbers(6..8) # while no worker runs
    Herald.start_workers
    assert_equal [6, 7, 8], Array.new(3) { Timeout.timeout(5) { got.pop } }
  end

  # A saved cursor wins over the option, 0 included (start: :now only decides for a missing cursor).
  def test_a_saved_cursor_wins_over_start_now
    store = use_store(log_store)
    publish_numbers(1..4)
    store.save_cursor("Known", 2)
    got = Queue.new
    define_subscriber("Known", Numbered, deferred: true) { |e, _m| got << e.n }
    Herald.start_workers
    assert_equal [3, 4], Array.new(2) { Timeout.timeout(5) { got.pop } }
  end

  def test_start_takes_now_or_oldest
    klass = Class.new { include Herald::Subscriber }
    assert_equal :now, klass.herald_start
    error = assert_raises(Herald::SubscriberError) { klass.deferred(start: :beginning) }
    assert_match(/:now, :oldest/, error.message)
    klass.deferred(start: :oldest)
    assert_equal :oldest, klass.herald_start
  end

  private

  def publish_numbers(range) = range.map { |n| Herald.publish_event(Numbered.new(n)) }
end
