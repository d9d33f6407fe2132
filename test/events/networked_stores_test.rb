# frozen_string_literal: true

require_relative "events_helper"
require_relative "../support/servers"
require "securerandom"

# Deferred subscribers use only the store contract (global_backlog, wait, cursors, leases): the same
# behaviour on Redis and PostgreSQL as on the Log store.
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
end

class RedisEventsTest < Minitest::Test
  include NetworkedEventsTests

  def build_store(namespace) = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: namespace)
end

class PostgresEventsTest < Minitest::Test
  include NetworkedEventsTests

  def build_store(namespace)
    Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: namespace)
  end
end
