# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/servers"
require "logger"
require "message_bus"

# Herald::Bus next to message_bus 4.5.1's own bus (MessageBus::Instance, memory backend): the same calls
# give the same results, on every Herald store. Issue 10, section 2.
module BusParity
  SITES = [["a", "s1"], ["b", nil], ["é 👋", "site ü"], ["d", "s1"], ["\u0000x", nil]].freeze

  def setup
    super
    @store = build_store
    @bus = Herald::Bus.new(store: @store)
    @mb = MessageBus::Instance.new
    @mb.configure(backend: :memory)
    @mb.logger = Logger.new(nil)
  end

  def teardown
    @mb.destroy
    @bus.close
    super
  end

  def drain(queue, count)
    eventually(message: "expected #{count} messages") { queue.size >= count }
    sleep 0.05 # anything more would be a duplicate
    Array.new(queue.size) { queue.pop }
  end

  # message_bus accepts any channel name: `abc` is a channel, and a different one from `/abc`. (Its memory
  # backend numbers messages with global ids, so ids are compared with Herald's own contract: 1, 2, 3...)
  def test_channels_without_a_leading_slash_work_as_in_message_bus
    %w[abc /abc chat/room 聊天 a|b].each_with_index do |channel, i|
      (i + 1).times do |n|
        assert @mb.publish(channel, "#{channel} #{n}")
        assert_equal n + 1, @bus.publish(channel, "#{channel} #{n}"), channel
      end
      assert @mb.publish(channel, "on s", site_id: "s")
      assert_equal 1, @bus.publish(channel, "on s", site_id: "s")
    end
    %w[abc /abc chat/room 聊天 a|b].each_with_index do |channel, i|
      assert_equal i + 1, @bus.last_id(channel), channel
      assert_equal @mb.backlog(channel, 0).map(&:data), @bus.backlog(channel, 0).map(&:data), channel
      assert_equal @mb.backlog(channel, 0, "s").map(&:data), @bus.backlog(channel, 0, site_id: "s").map(&:data)
      assert_equal [channel], @bus.backlog(channel, 0).map(&:channel).uniq
    end
    assert_equal({"abc" => 1, "/abc" => 2}, @bus.last_ids("abc", "/abc"))
    global = @bus.global_backlog(0).map { |m| [m.channel, m.site_id, m.data] }
    assert_includes global, ["abc", "s", "on s"]
    assert_includes global, ["聊天", nil, "聊天 3"]
  end

  def test_channels_that_cannot_work_are_refused_with_a_clear_error
    [nil, :abc, 1, ""].each do |channel|
      error = assert_raises(ArgumentError) { @bus.publish(channel, 1) }
      assert_match(/channel must be a non-empty String/, error.message)
    end
    error = assert_raises(ArgumentError) { @bus.publish("a$|$b", 1) }
    assert_match(/must not contain \$\|\$/, error.message)
    assert_raises(ArgumentError) { @bus.subscribe("") {} }
    assert_equal 0, @bus.store.last_global_id
  end

  def test_subscribe_sees_the_channel_from_every_site_like_message_bus
    herald = Queue.new
    mb = Queue.new
    @bus.subscribe("/chat") { |m| herald << [m.data, m.site_id] }
    @bus.subscribe("chat") { |m| herald << [:wrong_channel, m.channel] }
    @mb.subscribe("/chat") { |m| mb << [m.data, m.site_id] }
    publish_everywhere
    assert_equal SITES, drain(mb, SITES.size), "message_bus"
    assert_equal SITES, drain(herald, SITES.size), "herald"
  end

  def test_subscribe_with_a_site_id_sees_that_site_only
    seen = Queue.new
    @bus.subscribe("/chat", site_id: "s1") { |m| seen << [m.data, m.site_id] }
    publish_everywhere
    assert_equal [["a", "s1"], ["d", "s1"]], drain(seen, 2)
  end

  # Replays the channel's backlog without a site after last_id (what message_bus replays), then every
  # site live: no gap, no duplicate, and nothing published before the subscription from other sites.
  def test_subscribe_from_a_last_id_replays_then_sees_every_site
    @bus.publish("/chat", "old", site_id: "s1")
    3.times { |i| @bus.publish("/chat", "plain #{i}") }
    seen = Queue.new
    @bus.subscribe("/chat", 1) { |m| seen << [m.data, m.site_id] }
    @bus.publish("/chat", "new", site_id: "s1")
    @bus.publish("/chat", "plain 3")
    assert_equal [["plain 1", nil], ["plain 2", nil], ["new", "s1"], ["plain 3", nil]], drain(seen, 4)
  end

  def test_global_channels_are_seen_once_whatever_the_site
    seen = Queue.new
    @bus.subscribe("/global/news") { |m| seen << m.data }
    @bus.subscribe("/global/news", site_id: "s1") { |m| seen << "s1 #{m.data}" }
    @bus.publish("/global/news", 1, site_id: "s1")
    @bus.publish("/global/news", 2)
    assert_equal [1, 2, "s1 1", "s1 2"], drain(seen, 4).sort_by(&:to_s)
  end

  private

  def publish_everywhere
    SITES.each do |data, site|
      @bus.publish("/other", "x", site_id: site)
      @bus.publish("/chat", data, site_id: site)
      @mb.publish("/other", "x", site_id: site)
      @mb.publish("/chat", data, site_id: site)
    end
  end
end

class BusParityMemoryTest < Minitest::Test
  include BusParity

  def build_store = Herald::Store::Memory.new
end

class BusParityLogTest < Minitest::Test
  include BusParity

  def build_store
    @dir = Dir.mktmpdir("herald-parity")
    Herald::Store::Log.new(dir: @dir, fsync: :never)
  end

  def teardown
    super
    FileUtils.rm_rf(@dir)
  end

  def test_channels_without_a_leading_slash_survive_reopening
    @bus.publish("abc", "plain")
    @bus.publish("abc", "on s", site_id: "s")
    @bus.close
    @bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir))
    assert_equal ["plain"], @bus.backlog("abc").map(&:data)
    assert_equal ["on s"], @bus.backlog("abc", 0, site_id: "s").map(&:data)
    assert_equal 0, @bus.last_id("/abc")
    assert_equal 2, @bus.publish("abc", "again")
  end
end

class BusParityRedisTest < Minitest::Test
  include BusParity

  def setup
    Herald::TestServers.require!(self, :redis)
    super
  end

  def build_store = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: "p#{SecureRandom.hex(6)}")
end

class BusParityPostgresTest < Minitest::Test
  include BusParity

  def setup
    Herald::TestServers.require!(self, :postgres)
    super
  end

  def build_store = Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: "p_#{SecureRandom.hex(5)}")
end
