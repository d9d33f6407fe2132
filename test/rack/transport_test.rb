# frozen_string_literal: true

require_relative "../test_helper"

# The process's transport state on its own: what follows the bus, what follows the options.
class TransportTest < Minitest::Test
  def transport(bus: nil, **options)
    Herald::Rack::Transport.new(bus: bus, options: Herald::Rack::Middleware::DEFAULTS.merge(options).freeze, prefix: "/message-bus/")
  end

  def teardown
    @transports&.each(&:close)
    Herald.reset!
  end

  def kept(t) = (@transports ||= []) << t && t

  def test_the_default_bus_is_looked_up_each_time_and_a_new_one_gets_a_new_reactor_and_cache
    Herald.configure { |c| c.store = Herald::Store::Memory.new }
    t = kept(transport)
    first_reactor = t.reactor
    first_cache = t.reply_cache
    assert_same Herald.bus, t.bus
    assert_same first_reactor, t.reactor
    refute t.given_bus?
    Herald.reset!
    Herald.configure { |c| c.store = Herald::Store::Memory.new }
    assert_same Herald.bus, t.bus
    refute_same first_reactor, t.reactor, "a new default bus gets a new event loop"
    refute_same first_cache, t.reply_cache, "and an empty reply cache"
  end

  def test_a_given_bus_keeps_its_reply_cache
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    t = kept(transport(bus: bus))
    assert t.given_bus?
    assert_same t.reply_cache, t.reply_cache
    assert_same bus, t.reactor.bus
  ensure
    bus&.close
  end

  def test_lookups_and_filters_make_replies_per_client
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    assert kept(transport(bus: bus)).shareable?
    [{user_id_lookup: ->(_) { 1 }}, {site_id_lookup: ->(_) { "é" }}, {client_message_filters: [["/c", ->(_) { true }]]}].each do |options|
      t = kept(transport(bus: bus, **options))
      refute t.shareable?, options.keys.inspect
      assert_nil t.reply_cache, "no reply cache for #{options.keys.inspect}"
    end
    assert_nil kept(transport(bus: bus, reply_cache: false)).reply_cache
  ensure
    bus&.close
  end

  def test_active_clients_count_this_process_only_and_close_ends_the_loop
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    t = kept(transport(bus: bus))
    assert_equal 0, t.active_clients
    reactor = t.reactor
    t.close
    assert_equal 0, t.active_clients
    refute_same reactor, t.reactor, "a closed transport builds a new loop when asked"
  ensure
    bus&.close
  end
end
