# frozen_string_literal: true

require "test_helper"
require "json"
require "net/http"
require "herald/server"
require "securerandom"
require_relative "../support/servers"

# herald server's front end answers a repeated poll from its Rack::ReplyCache (whole HTTP replies) while the
# store is unchanged: the bytes must be exactly what the middleware would answer, for every client, every time.
class ReplyCacheTest < Minitest::Test
  def setup
    @events = []
  end

  def teardown
    @server&.stop
    @server&.wait
    @subscriber && Herald::Instrumentation.unsubscribe(@subscriber)
  end

  def test_a_repeated_poll_is_served_from_the_cache_until_the_store_changes
    start
    @server.bus.publish("/chat", "première ✓")
    http do |h|
      first = poll(h, "a1", "/chat" => 0)
      assert_equal ["première ✓"], data(first)
      assert_equal first, poll(h, "a2", "/chat" => 0), "another client, the same request: the same bytes"
      assert_equal 1, cache.size
      @server.bus.publish("/chat", "deuxième 🎉")
      assert_equal ["première ✓", "deuxième 🎉"], data(poll(h, "a3", "/chat" => 0)), "a publish ends the entry"
      assert_equal ["deuxième 🎉"], data(poll(h, "a4", "/chat" => 1)), "other positions, another entry"
      assert_equal 400, h.post("/message-bus/bad!id/poll?dlp=t", JSON.generate("/chat" => 0), "Content-Type" => "application/json").code.to_i,
        "a client id the middleware refuses is refused whatever the cache holds"
    end
  end

  # A message for one client id (client_ids:) must never reach another client through a shared reply.
  def test_targeted_messages_are_never_shared
    start
    @server.bus.publish("/chat", "for everyone")
    @server.bus.publish("/chat", "for c1 only", client_ids: ["c1"])
    http do |h|
      3.times do
        assert_equal ["for everyone", "for c1 only"], data(poll(h, "c1", "/chat" => 0))
        assert_equal ["for everyone"], data(poll(h, "c2", "/chat" => 0))
      end
    end
    assert_equal 0, cache.size
  end

  def test_nothing_is_shared_with_a_lookup
    start(user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i })
    @server.bus.publish("/chat", "everyone")
    http do |h|
      2.times { assert_equal ["everyone"], data(poll(h, "u1", "/chat" => 0)) }
    end
    assert_equal 0, cache.size
  end

  # With extra_response_headers_lookup (CORS) the front end keeps no whole replies (their headers are each
  # request's); the middleware's own cache shares the body, and every reply has its own request's headers.
  def test_extra_response_headers_are_each_requests
    start(extra_response_headers_lookup: ->(env) { {"Access-Control-Allow-Origin" => env["HTTP_ORIGIN"]} })
    @server.bus.publish("/chat", "cors ✓ 🎉")
    http do |h|
      3.times do
        %w[https://a.test https://b.test].each do |origin|
          response = h.post("/message-bus/o1/poll?dlp=t", JSON.generate("/chat" => 0), "Content-Type" => "application/json", "Origin" => origin)
          assert_equal origin, response["access-control-allow-origin"]
          assert_equal ["cors ✓ 🎉"], data(response.body)
        end
      end
    end
    assert_equal 0, cache.size, "the front end keeps no reply"
    assert_equal 1, @server.app.reply_cache.size, "the middleware keeps one body"
  end

  def test_reply_cache_false_turns_off_both_caches
    start(reply_cache: false)
    @server.bus.publish("/chat", "x")
    http { |h| 2.times { assert_equal ["x"], data(poll(h, "n1", "/chat" => 0)) } }
    assert_nil cache
    assert_nil @server.app.reply_cache
  end

  def test_instrumented_polls_each_get_their_event
    start
    @server.bus.publish("/chat", "x")
    http do |h|
      2.times { poll(h, "i1", "/chat" => 0) } # the second from the cache
      @subscriber = Herald::Instrumentation.subscribe("poll.herald") { |*args| @events << args }
      3.times { assert_equal ["x"], data(poll(h, "i2", "/chat" => 0)) }
    end
    assert_equal 3, @events.size
  end

  private

  def start(**options)
    @server = Herald::Server.new(port: 0, store: Herald::Store::Memory.new, log: nil, **options).start
  end

  def cache = @server.instance_variable_get(:@server).instance_variable_get(:@cache)

  def http(&) = Net::HTTP.start("127.0.0.1", @server.port, &)

  def poll(h, client, channels)
    response = h.post("/message-bus/#{client}/poll?dlp=t", JSON.generate(channels), "Content-Type" => "application/json")
    assert_equal "200", response.code
    response.body
  end

  def data(body) = JSON.parse(body).reject { |m| m["channel"] == "/__status" }.map { |m| m["data"] }
end

# With a networked store a poll waits for a round trip: herald server's front end runs polls on its thread
# pool (several wait at once) instead of its event loop, and keeps no reply cache for them.
class FrontNetworkedStoreTest < Minitest::Test
  def test_polls_run_on_the_pool_with_a_redis_store
    url = Herald::TestServers.require!(self, :redis)
    store = Herald::Store::Redis.new(url: url, namespace: "front-#{SecureRandom.hex(4)}")
    server = Herald::Server.new(port: 0, store: store, log: nil).start
    front = server.instance_variable_get(:@server)
    refute front.instance_variable_get(:@inline).call("/message-bus/c1/poll"), "a poll goes to the pool"
    server.bus.publish("/chat", "via Redis ✓")
    threads = []
    app = server.app
    app.define_singleton_method(:call) { |env| (threads << Thread.current.name) && super(env) }
    body = Net::HTTP.post(URI("#{server.url}/message-bus/c1/poll?dlp=t"), JSON.generate("/chat" => 0), "Content-Type" => "application/json").body
    assert_equal ["via Redis ✓"], JSON.parse(body).map { |m| m["data"] }
    assert_match(/\Aherald-app-\d\z/, threads.first)
  ensure
    server&.stop
    server&.wait
  end
end
