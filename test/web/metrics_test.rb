# frozen_string_literal: true

require_relative "web_helper"
require_relative "../events/events_helper"

# Herald::Web::Metrics: its figures agree with what the test did, on the Log store and on Redis.
module Herald
  module MetricsCases
    include RackHelpers
    include WebTestSupport

    DATA = ["héllo 👋", "a\u0000b", "", {"日本語" => [1, 2.5, nil]}, "x" * 70_000].freeze

    def setup
      @tmp = Dir.mktmpdir("herald-metrics")
      @bus = Bus.new(store: build_store)
      @middlewares = []
      @servers = []
      Metrics.reset!
      @seed = Integer(ENV["SEED"] || rand(1 << 32))
      @random = Random.new(@seed)
      puts "#{self.class}##{name} seed=#{@seed}" if ENV["VERBOSE"]
    end

    def teardown
      super
      FileUtils.rm_rf(@tmp)
    end

    def app = Web::Metrics.new(bus: @bus, subscribers: [])

    def test_published_and_delivered_to_subscribers
      n = 30 + @random.rand(40)
      subs = 3
      got = Array.new(subs) { Queue.new }
      handles = got.map { |q| @bus.subscribe("/m") { |msg| q << msg.data } }
      sleep 0.2 # the dispatcher is live before the first publish (a subscription's start is "now")
      sent = Array.new(n) { DATA[@random.rand(DATA.size)] }
      sent.each { |data| @bus.publish("/m", data) }
      got.each { |q| eventually(message: "seed #{@seed}") { q.size == n } }
      assert_equal [sent] * subs, got.map { |q| Array.new(q.size) { q.pop } }
      s = scrape(app)
      assert_equal n, s["herald_messages_published_total"], "seed #{@seed}"
      assert_equal n * subs, s['herald_messages_delivered_total{transport="subscriber"}'], "seed #{@seed}"
      assert_equal n, s["herald_publish_duration_seconds_count"]
      assert_equal n, s['herald_publish_duration_seconds_bucket{le="+Inf"}']
      assert_operator s["herald_publish_duration_seconds_sum"], :>, 0
      assert_equal @bus.store.last_global_id, s["herald_last_global_id"]
      assert_equal 1, s["herald_store_up"]
      %w[long_poll streaming sse cable].each { |t| assert_equal 0, s["herald_messages_delivered_total{transport=\"#{t}\"}"] }
      handles.each(&:unsubscribe)
    end

    # Parked long polls and a stream: the gauge counts them, a publish is delivered to each (once per
    # client), and the delivery latency is observed once per message fanned out.
    def test_parked_clients_and_http_deliveries
      mw = middleware(long_polling_interval: 5)
      m = mock(mw)
      others = scrape(app)["herald_parked_clients"] # the whole suite runs in one process: others' reactors count
      polls = Array.new(3) { |i| in_thread { poll(m, {"/lp" => 0}, client: "lp#{i}", HTTP_DONT_CHUNK: "t") } }
      stream = in_thread { poll(m, {"/lp" => 0}, client: "stream") }
      parked(mw, 4)
      assert_equal others + 4, scrape(app)["herald_parked_clients"]
      @bus.publish("/lp", "to every parked client 👋")
      polls.each { |t| assert_equal ["to every parked client 👋"], ids(JSON.parse(t.value.body)) }
      s = nil
      eventually { (s = scrape(app))['herald_messages_delivered_total{transport="streaming"}'] == 1 }
      assert_equal 3, s['herald_messages_delivered_total{transport="long_poll"}']
      assert_equal 1, s["herald_messages_published_total"]
      assert_equal 0, s['herald_messages_delivered_total{transport="subscriber"}'], "the reactor's own subscription (Redis) is no subscriber"
      assert_equal 1, s["herald_delivery_latency_seconds_count"]
      assert_operator s["herald_parked_clients"], :<=, others + 1 # the stream, until its deadline
      mw.close
      stream.value
      # A poll answered at once from the backlog: its messages count too.
      2.times { |i| @bus.publish("/now", i) }
      response = poll(mock(middleware), {"/now" => 0}, client: "short", query: "dlp=t")
      assert_equal [0, 1], ids(JSON.parse(response.body))
      assert_equal 5, scrape(app)['herald_messages_delivered_total{transport="long_poll"}']
    end

    # Identical polls answered from the reply cache (the middleware's, and herald server's front end's) count
    # their messages each time, as the first, built reply did.
    def test_replies_from_the_reply_cache_count_their_messages
      3.times { |i| @bus.publish("/cached", "m#{i} 👋") }
      mw = middleware
      m = mock(mw)
      4.times { |i| assert_equal %w[m0 m1 m2].map { |t| "#{t} 👋" }, ids(JSON.parse(poll(m, {"/cached" => 0}, client: "c#{i}", query: "dlp=t").body)) }
      assert_equal 4 * 3, scrape(app)['herald_messages_delivered_total{transport="long_poll"}'], "1 built + 3 cached replies of 3"
      require "herald/server"
      front = Herald::Server::Front.new(app: mw, inline: ->(path) { path.start_with?("/message-bus/") }, host: "127.0.0.1", port: 0,
        threads: 2, max_request_bytes: Herald::Server::DEFAULT_MAX_REQUEST_BYTES, cache: Herald::Rack::ReplyCache.new(store: @bus.store, prefix: mw.prefix)).start
      socket = TCPSocket.new("127.0.0.1", front.port) # keep-alive: the front end keeps replies on such connections
      5.times do |i|
        body = "/cached=1"
        socket.write("POST /message-bus/f#{i}/poll?dlp=t HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n" \
          "Content-Length: #{body.bytesize}\r\n\r\n#{body}")
        head = socket.readline("\r\n\r\n")
        reply = socket.read(Integer(head[/^content-length: (\d+)/i, 1]))
        assert_equal ["HTTP/1.1 200", %w[m1 m2].map { |t| "#{t} 👋" }], [head[0, 12], ids(JSON.parse(reply.force_encoding("UTF-8")))]
      end
      assert_equal 4 * 3 + 5 * 2, scrape(app)['herald_messages_delivered_total{transport="long_poll"}'], "front: 1 built, then its cache"
    ensure
      socket&.close
      front&.stop
    end

    # No label is a channel: 10,000 channels make no more series than one.
    def test_series_stay_bounded_with_ten_thousand_channels
      @bus.publish("/one", 1)
      before = scrape(app).keys
      10_000.times { |i| @bus.publish("/c/#{i}/#{@random.rand(1 << 30)}", i) }
      after = scrape(app)
      assert_equal before.sort, after.keys.sort
      assert_equal 10_001, after["herald_messages_published_total"]
      refute(after.keys.any? { |k| k.include?("/c/") })
    end

    # The lock-free counters and histograms lose nothing when threads add at once.
    def test_threads_adding_at_once_lose_nothing
      threads = Array.new(8) do |t|
        Thread.new do
          20_000.times do |i|
            Metrics::DELIVERED.add(1, Metrics::SSE)
            Metrics::FSYNC_DURATION.observe(i.odd? ? 0.0001 : 20.0)
            Metrics::RETRIES.increment(1, "T#{t % 3}")
          end
        end
      end
      threads.each(&:join)
      s = scrape(app)
      assert_equal 160_000, s['herald_messages_delivered_total{transport="sse"}']
      assert_equal 160_000, s["herald_fsync_duration_seconds_count"]
      assert_equal 80_000, s['herald_fsync_duration_seconds_bucket{le="0.0001"}']
      assert_equal 80_000, s['herald_fsync_duration_seconds_bucket{le="10"}']
      assert_in_delta 80_000 * 20.0001, s["herald_fsync_duration_seconds_sum"], 0.01
      assert_equal 160_000, (0..2).sum { |t| s["herald_retries_total{subscriber=\"T#{t}\"}"] }
    end

    # Subscriber labels are capped: names beyond MAX_LABEL_VALUES count as "other".
    def test_subscriber_label_values_are_capped
      (Metrics::MAX_LABEL_VALUES + 50).times { |i| Metrics::RETRIES.increment(1, "Sub#{i}") }
      s = scrape(app).select { |k, _| k.start_with?("herald_retries_total") }
      assert_equal Metrics::MAX_LABEL_VALUES + 1, s.size
      assert_equal 50, s['herald_retries_total{subscriber="other"}']
      assert_equal Metrics::MAX_LABEL_VALUES + 50, s.values.sum
    end
  end
end

class LogStoreMetricsTest < Minitest::Test
  include Herald::MetricsCases

  def build_store(fsync: :interval) = Herald::Store::Log.new(dir: File.join(@tmp, "log"), fsync: fsync)

  # A forked worker's counters start from zero: summing processes does not count the parent's twice.
  def test_a_forked_child_starts_from_zero
    3.times { |i| @bus.publish("/p", i) }
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      @bus.publish("/p", "from the child")
      writer.write(Herald::Web::Metrics.new(bus: @bus, subscribers: []).render)
      writer.close
      exit!(0)
    end
    writer.close
    child = reader.read
    Process.wait(pid)
    assert_match(/^herald_messages_published_total 1$/, child)
    assert_match(/^herald_publish_duration_seconds_count 1$/, child)
    assert_match(/^herald_last_global_id 4$/, child)
    assert_equal 3, scrape(app)["herald_messages_published_total"]
  ensure
    reader&.close
  end

  def test_log_bytes_and_fsync_duration
    @bus.close
    @bus = Herald::Bus.new(store: build_store(fsync: :always))
    @bus.publish("/b", "x" * 10_000)
    s = scrape(app)
    assert_equal File.size(Dir[File.join(@tmp, "log", "*.log")].first), s["herald_log_bytes"]
    assert_operator s["herald_log_bytes"], :>, 10_000
    assert_operator s["herald_fsync_duration_seconds_count"], :>=, 1
  end
end

class RedisStoreMetricsTest < Minitest::Test
  include Herald::MetricsCases

  def setup
    Herald::TestServers.require!(self, :redis)
    super
  end

  def build_store = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: "m#{SecureRandom.hex(6)}")

  def test_no_log_bytes_without_a_log
    s = scrape(app)
    refute s.key?("herald_log_bytes")
    assert_equal 1, s["herald_store_up"]
  end
end

class PostgresStoreMetricsTest < Minitest::Test
  include Herald::MetricsCases

  def setup
    Herald::TestServers.require!(self, :postgres)
    super
  end

  def build_store = Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: "m_#{SecureRandom.hex(5)}")
end

# Retries and dead letters of deferred subscribers, and their handler calls as deliveries.
class EventsMetricsTest < Minitest::Test
  include Herald::EventsTestSupport
  include Herald::WebTestSupport

  def test_retries_dead_letters_and_handled_events
    use_store(log_store)
    Herald::Metrics.reset!
    define_subscriber("Flaky", "/jobs", deferred: true, retry_on: {attempts: 3, wait: 0.001}) do |event, _|
      raise KeyError, "odd #{event["n"]}" if event["n"].odd?
    end
    Herald.start_workers
    capture_log do
      6.times { |i| Herald.publish_event({"n" => i, "text" => "ü 👋"}, channel: "/jobs") }
      eventually { Herald::Metrics::DEAD_LETTERS.value("Flaky") == 3 }
    end
    s = scrape(Herald::Web::Metrics.new(bus: Herald.bus))
    assert_equal 6, s["herald_messages_published_total"]
    assert_equal 3 * 2, s['herald_retries_total{subscriber="Flaky"}'], "3 odd events, 2 retries each"
    assert_equal 3, s['herald_dead_letters_total{subscriber="Flaky"}']
    assert_equal 3, s['herald_messages_delivered_total{transport="subscriber"}'], "the even ones handled"
    assert s.key?('herald_subscriber_lag_messages{subscriber="Flaky"}')
  end
end

# ActionCable broadcasts (adapter: herald) through Herald::Cable::Listener: one delivery per stream callback.
class CableMetricsTest < Minitest::Test
  include Herald::WebTestSupport

  EXECUTOR = Object.new
  def EXECUTOR.post(&block) = Thread.new(&block)

  def test_each_stream_callback_is_a_cable_delivery
    require "herald/cable/listener"
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    listener = Herald::Cable::Listener.new(store: bus.store, executor: EXECUTOR)
    Herald::Metrics.reset!
    got = Queue.new
    confirmed = Queue.new
    2.times { listener.add(Herald::Cable.channel("room_1"), ->(payload) { got << payload }, -> { confirmed << true }) }
    2.times { Timeout.timeout(5) { confirmed.pop } }
    payloads = ["{\"html\":\"<p>héllo 👋</p>\"}", "", "\u0000"]
    payloads.each { |p| bus.store.append(Herald::Cable.channel("room_1"), p, codec: Herald::Codec::Raw) }
    eventually { got.size == 2 * payloads.size }
    s = scrape(Herald::Web::Metrics.new(bus: bus, subscribers: []))
    assert_equal 2 * payloads.size, s['herald_messages_delivered_total{transport="cable"}']
  ensure
    listener&.stop
    bus&.close
  end
end
