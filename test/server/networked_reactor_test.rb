# frozen_string_literal: true

require_relative "../rack/rack_helper"
require_relative "../support/servers"
require "securerandom"

# Reading a networked store is a round trip the event loop must not wait for: with Redis and PostgreSQL a
# parked long poll still gets its messages through the bus's dispatcher thread (Memory and the Log wake the
# loop directly: test/rack/reactor_wake_test.rb). Here, not in test/rack: bin/test-rack2's bundle has
# neither client gem.
class NetworkedReactorTest < Minitest::Test
  include Herald::RackHelpers

  # Reading a networked store is a round trip the loop must not wait for: its messages still come through
  # the bus's dispatcher thread.
  def test_a_redis_store_reaches_the_loop_through_the_bus
    url = Herald::TestServers.require!(self, :redis)
    assert_reaches_parked_poll(Herald::Bus.new(store: Herald::Store::Redis.new(url: url, namespace: "wake-#{SecureRandom.hex(4)}")))
  end

  def test_a_postgres_store_reaches_the_loop_through_the_bus
    url = Herald::TestServers.require!(self, :postgres)
    assert_reaches_parked_poll(Herald::Bus.new(store: Herald::Store::Postgres.new(url: url, table: "wake_#{SecureRandom.hex(4)}")))
  end

  private

  def middleware_on(bus)
    Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 5).tap { |mw| @middlewares << mw }
  end

  def assert_reaches_parked_poll(bus)
    mw = middleware_on(bus)
    socket = puma(mw).request({"/n" => bus.last_id("/n")}, headers: {"Dont-Chunk" => "t"})
    parked(mw)
    bus.publish("/n", "über 🎉 \u0000")
    status, _, body = Herald::PumaServer.read(socket)
    assert_equal [200, ["über 🎉 \u0000"]], [status, JSON.parse(body.force_encoding(Encoding::UTF_8)).map { |m| m["data"] }]
    assert_includes Thread.list.filter_map(&:name), "herald-dispatcher"
  ensure
    bus.close
  end
end
