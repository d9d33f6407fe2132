# frozen_string_literal: true

require_relative "events_helper"
require_relative "data_test"
require_relative "../support/servers"
require "securerandom"

# Deferred subscribers use only the store contract (global_backlog, wait, cursors, leases): the same
# behaviour on Redis and PostgreSQL as on the Log store, and the same bytes (EventDataTests).
module NetworkedEventsTests
  include Herald::EventsTestSupport

  def test_deferred_subscriber_handles_in_order_saves_its_cursor_and_resumes_after_it
    namespace = "ev#{SecureRandom.hex(4)}"
    got = Queue.new
    use_store(build_store(namespace))
    define_subscriber("Net", Numbered, deferred: true) { |e, _m| got << e.n }
    (1..100).each { |i| Herald.publish_event(Numbered.new(i)) }
    assert_equal (1..100).to_a, Array.new(100) { got.pop }
    assert Herald.shutdown(timeout: 2)
    cursor = Herald.bus.store.load_cursor("Net")
    assert_equal Herald.bus.store.last_global_id, cursor

    Herald.reset! # a restart: a new store object on the same data; the subscriber class stays registered
    use_store(build_store(namespace))
    (101..120).each { |i| Herald.publish_event(Numbered.new(i)) }
    assert_equal (101..120).to_a, Array.new(20) { got.pop }, "resumed after the cursor: nothing repeated, nothing lost"
  end

  # A damaged cursor never reads as 0 (it did on both stores: `.to_i`), which would run every retained
  # event again: it is a named error, and the subscriber stops.
  def test_a_damaged_cursor_is_a_named_error_and_stops_the_subscriber
    namespace = "ev#{SecureRandom.hex(4)}"
    store = use_store(build_store(namespace))
    store.save_cursor("Net", 3)
    assert_equal 3, store.load_cursor("Net")
    assert_raises(Herald::InvalidArgumentError) { store.save_cursor("Net", -1) }
    damaged_values.each do |bad|
      damage_cursor(namespace, "Net", bad)
      error = assert_raises(Herald::CorruptCursorError, bad.inspect) { store.load_cursor("Net") }
      assert_equal "Net", error.name
    end
    got = []
    log = capture_log do
      define_subscriber("Net", Numbered, deferred: true) { |e, _m| got << e.n }
      5.times { |i| Herald.publish_event(Numbered.new(i + 1)) }
      eventually { Herald::Events.runtime.workers.first&.error }
    end
    assert_equal [], got, "nothing replayed from 0"
    assert_match(/deferred subscriber Net stopped: Herald::CorruptCursorError/, log)
  end
end

class RedisEventsTest < Minitest::Test
  include NetworkedEventsTests
  include EventDataTests

  def new_store = build_store("ev#{SecureRandom.hex(4)}")

  def build_store(namespace) = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: namespace)

  def damaged_values = ["-5", "abc", "", "12abc", "\xFF\x00".b]

  def damage_cursor(namespace, name, value)
    RedisClient.new(url: Herald::TestServers.redis_url).call("HSET", "#{namespace}:cursors", name, value)
  end
end

class PostgresEventsTest < Minitest::Test
  include NetworkedEventsTests
  include EventDataTests

  def new_store = build_store("ev#{SecureRandom.hex(4)}")

  def build_store(namespace)
    Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: namespace)
  end

  # The column is a bigint: a negative number is the damage it can hold.
  def damaged_values = ["-5"]

  def damage_cursor(namespace, name, value)
    conn = PG.connect(Herald::TestServers.postgres_url)
    conn.exec_params("UPDATE #{namespace}_cursors SET global_id = $1 WHERE name = $2", [value, name])
  ensure
    conn&.close
  end
end
