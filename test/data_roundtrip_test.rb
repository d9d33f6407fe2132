# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/servers"
require_relative "support/real_data"

# Every byte comes back: the data users send (accents, CJK, emoji and ZWJ sequences, NUL, empty and
# 1 MiB values, binary with MessagePack) in data, channel names and site ids, through every store, both
# codecs and the store-level read paths (backlog, global_backlog, subscribe from an id, reopen).
# The HTTP and CLI paths have their own tests (test/rack/data_roundtrip_test.rb, test/server/cli_test.rb).
module DataRoundtrip
  include RealData

  def samples(codec)
    texts = TEXTS.map { |t| {"text" => t, "t€xt" => [t, 1, nil, true, 2.5]} } + TEXTS
    (codec == :msgpack) ? texts + BINARY + [{"blob" => BINARY.first, "ü" => BINARY[2]}] : texts
  end

  def test_data_round_trips_byte_for_byte_with_json
    round_trip(:json)
  end

  def test_data_round_trips_byte_for_byte_with_msgpack
    round_trip(:msgpack)
  end

  def test_channel_names_and_site_ids_round_trip_and_stay_apart
    bus = Herald::Bus.new(store: @store, codec: :json)
    published = CHANNELS.product(SITES).map do |channel, site|
      [channel, site, bus.publish_message(channel, "#{channel}@#{site.inspect}", site_id: site)]
    end
    check_sites(published)
    return unless respond_to?(:reopened)
    @store = reopened
    check_sites(published)
  end

  def test_an_empty_site_is_a_site_of_its_own
    bus = Herald::Bus.new(store: @store, codec: :json)
    bus.publish("/s", "for site ''", site_id: "")
    bus.publish("/s", "for no site")
    assert_equal ["for no site"], bus.backlog("/s").map(&:data)
    assert_equal ["for site ''"], bus.backlog("/s", site_id: "").map(&:data)
    assert_equal ["", nil], bus.global_backlog.map(&:site_id)
    return unless respond_to?(:reopened)
    bus = Herald::Bus.new(store: reopened, codec: :json)
    assert_equal ["for no site"], bus.backlog("/s").map(&:data)
    assert_equal ["for site ''"], bus.backlog("/s", site_id: "").map(&:data)
  end

  def test_subscribe_from_an_id_delivers_the_same_bytes
    bus = Herald::Bus.new(store: @store, codec: :msgpack)
    sent = samples(:msgpack).first(6) + BINARY.first(3)
    sent.each { |d| bus.publish("/sub/ü", d) }
    got = Queue.new
    sub = bus.subscribe("/sub/ü", 0) { |m| got << m }
    received = sent.size.times.map { Timeout.timeout(5) { got.pop } }
    sub.unsubscribe
    assert_equal sent, received.map(&:data)
    received.each { |m| assert_equal "/sub/ü", m.channel }
  end

  private

  def round_trip(codec)
    codec = Herald::Codec.fetch(codec)
    bus = Herald::Bus.new(store: @store, codec: codec)
    sent = samples(codec.name).each_with_index.map { |data, i| [data, bus.publish_message("/rt/ü/#{i % 3}", data)] }
    check(sent, codec, @store)
    check(sent, codec, reopened) if respond_to?(:reopened)
  end

  def check(sent, codec, store)
    by_gid = store.global_backlog(0).to_h { |m| [m.global_id, m] }
    by_channel = %w[0 1 2].flat_map { |c| store.backlog("/rt/ü/#{c}", 0) }.to_h { |m| [m.global_id, m] }
    sent.each do |data, published|
      [by_gid, by_channel].each do |read|
        msg = read.fetch(published.global_id)
        where = "#{self.class} #{codec.name} #{data.to_s[0, 40].inspect}"
        assert_equal codec.encode(data).b, msg.payload.b, "payload bytes, #{where}"
        assert_equal codec_encoding(codec, msg), msg.payload.encoding, "payload encoding, #{where}"
        assert_equal published.channel, msg.channel, where
        assert_equal Encoding::UTF_8, msg.channel.encoding, where
        assert_equal data, msg.data, "data, #{where}"
        assert_encodings_equal data, msg.data, where
      end
    end
  end

  def check_sites(published)
    published.each do |channel, site, msg|
      got = @store.backlog(channel, 0, site_id: site)
      assert_equal ["#{channel}@#{site.inspect}"], got.map(&:data), "#{channel.inspect} site #{site.inspect}"
      assert_equal [site], got.map(&:site_id)
      assert_equal [msg.message_id], got.map(&:message_id)
      assert_equal Encoding::UTF_8, got.first.site_id.encoding if site
      assert_equal Encoding::UTF_8, got.first.channel.encoding
    end
    assert_equal published.map { |_, site, _| site }, @store.global_backlog(0).map(&:site_id)
  end

  def codec_encoding(codec, msg)
    (codec.name == :json) ? Encoding::UTF_8 : msg.payload.encoding.then { Encoding::BINARY }
  end

  # Binary Strings must come back binary, text as UTF-8: equal bytes in another encoding are a defect.
  def assert_encodings_equal(sent, got, where)
    case sent
    when String then assert_equal((sent.encoding == Encoding::BINARY) ? Encoding::BINARY : Encoding::UTF_8, got.encoding, where)
    when Array then sent.zip(got) { |s, g| assert_encodings_equal(s, g, where) }
    when Hash then sent.each { |k, v| assert_encodings_equal(v, got[k], where) }
    end
  end
end

class MemoryDataRoundtripTest < Minitest::Test
  include DataRoundtrip

  def setup = @store = Herald::Store::Memory.new

  def teardown = @store.close
end

# The embedded log in each fsync mode, read in the process that wrote, then by a fresh store on the directory.
%i[always interval never].each do |mode|
  Class.new(Minitest::Test) do
    include DataRoundtrip

    define_method(:setup) do
      @dir = Dir.mktmpdir("herald-rt")
      @store = Herald::Store::Log.new(dir: @dir, fsync: mode)
      @opened = [@store]
    end

    define_method(:reopened) do
      @opened.last.close
      Herald::Store::Log.new(dir: @dir, fsync: mode).tap { |s| @opened << s }
    end

    define_method(:teardown) do
      @opened.each(&:close)
      FileUtils.rm_rf(@dir)
    end

    Object.const_set(:"Log#{mode.capitalize}DataRoundtripTest", self)
  end
end

class RedisDataRoundtripTest < Minitest::Test
  include DataRoundtrip

  def setup
    Herald::TestServers.require!(self, :redis)
    @store = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: "rt#{SecureRandom.hex(4)}", backlog_cache: false)
  end

  def teardown = @store&.close
end

class PostgresDataRoundtripTest < Minitest::Test
  include DataRoundtrip

  def setup
    Herald::TestServers.require!(self, :postgres)
    @store = Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: "rt_#{SecureRandom.hex(5)}", backlog_cache: false)
  end

  def teardown = @store&.close
end
