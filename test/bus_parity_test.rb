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
      error = assert_raises(Herald::InvalidMessageError) { @bus.publish(channel, 1) }
      assert_match(/channel must be a non-empty String/, error.message)
    end
    error = assert_raises(Herald::InvalidMessageError) { @bus.publish("a$|$b", 1) }
    assert_match(/must not contain \$\|\$/, error.message)
    assert_raises(Herald::InvalidArgumentError) { @bus.subscribe("") {} }
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

  # Subscribing while other threads publish on several sites: every message after the subscription is
  # delivered once, the site-less replay has no gap, nothing from before comes from another site.
  def test_subscribe_on_every_site_while_publishing_has_no_gap_and_no_duplicate
    seed = Integer(ENV.fetch("SEED", rand(1 << 30)))
    random = Random.new(seed)
    sites = [nil, "s1", "s2", "ü"]
    plans = Array.new(3) { Array.new(100) { sites.sample(random: random) } }
    seen = Queue.new
    publishers = plans.map { |plan| Thread.new { plan.each_with_index { |site, i| @bus.publish("/c", i, site_id: site) } } }
    sleep 0.005 * random.rand
    from = @bus.last_id("/c") / 2
    before = @store.last_global_id
    @bus.subscribe("/c", from) { |m| seen << m }
    after = @store.last_global_id
    publishers.each(&:join)
    @bus.publish("/c", "last")
    got = []
    eventually(message: "the last message never came (seed #{seed})") do
      got << seen.pop until seen.empty?
      got.last&.data == "last"
    end
    sleep 0.05
    got << seen.pop until seen.empty?
    all = @bus.global_backlog(0)
    assert_equal got.map(&:global_id).uniq, got.map(&:global_id), "no duplicate (seed #{seed})"
    expected = all.select { |m| m.global_id > after || (m.site_id.nil? && m.message_id > from) }.map(&:global_id)
    allowed = all.select { |m| m.global_id > before || (m.site_id.nil? && m.message_id > from) }.map(&:global_id)
    assert_empty expected - got.map(&:global_id), "no gap (seed #{seed})"
    assert_empty got.map(&:global_id) - allowed, "nothing from before the subscription (seed #{seed})"
  end

  # docs/http.md, "Differences from message_bus": subscribing from the channel's last id, message_bus replays the
  # whole backlog when the next message comes; Herald delivers the new message only.
  def test_subscribing_from_the_last_id_delivers_new_messages_once
    herald = Queue.new
    mb = Queue.new
    3.times { |i| [@bus, @mb].each { |bus| bus.publish("/c", "old #{i}") } }
    @bus.subscribe("/c", @bus.last_id("/c")) { |m| herald << m.data }
    @mb.subscribe("/c", @mb.last_id("/c")) { |m| mb << m.data }
    [@bus, @mb].each { |bus| bus.publish("/c", "new") }
    assert_equal ["new"], drain(herald, 1)
    assert_equal ["old 0", "old 1", "old 2", "new"], drain(mb, 4), "message_bus's replay from 0 (if this changes, update docs/http.md)"
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

  # docs/http.md, "Differences from message_bus": its Redis backend restarts a channel's ids at 1 once the backlog
  # expired (the id key has the backlog's TTL); Herald keeps counting.
  def test_ids_keep_counting_after_the_backlog_expires
    mb = MessageBus::Instance.new
    mb.configure(backend: :redis, redis_config: {url: Herald::TestServers.redis_url})
    mb.logger = Logger.new(nil)
    channel = "/expiring-#{SecureRandom.hex(4)}"
    assert_equal [1, 2], Array.new(2) { mb.publish(channel, "x", max_backlog_age: 1) }
    assert_equal [1, 2], Array.new(2) { @bus.publish(channel, "x", max_backlog_age: 1) }
    sleep 2.1 # Redis expires keys with a resolution of a second
    assert_equal [], @bus.backlog(channel)
    assert_equal 1, mb.publish(channel, "x"), "message_bus's restart at 1 (if this changes, update docs/http.md)"
    assert_equal 3, @bus.publish(channel, "x")
  ensure
    mb&.destroy
  end
end

class BusParityPostgresTest < Minitest::Test
  include BusParity

  def setup
    Herald::TestServers.require!(self, :postgres)
    super
  end

  def build_store = Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: "p_#{SecureRandom.hex(5)}")
end
