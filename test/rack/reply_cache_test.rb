# frozen_string_literal: true

require_relative "rack_helper"
require "msgpack"
require "cgi"
require "rack/method_override"

# The middleware answers a repeated poll from its ReplyCache (the body built for the first; headers built
# per request) while the store is unchanged. Every request must get exactly what the middleware answers
# without the cache: the randomized tests replay the same requests against a middleware with
# `reply_cache: false` on the same bus and compare status, headers and body (SEED=N replays a run).
class ReplyCacheMiddlewareTest < Minitest::Test
  include Herald::RackHelpers

  # A Memory store that counts the reads a poll makes: none when the reply comes from the cache.
  class CountingStore < Herald::Store::Memory
    attr_accessor :reads

    def initialize(...)
      super
      @reads = 0
    end

    def last_ids(...)
      @reads += 1
      super
    end

    def backlog(...)
      @reads += 1
      super
    end
  end

  DATA = ["plain", "première ✓ 日本語", "emoji 🎉👍🏽", "nul\0byte", "", {"k" => "ü\0🎉", "n" => [1, nil]}].freeze
  CLIENTS = %w[c1 c2 cx].freeze
  CHANNELS = ["/a", "/b", "/ü 🎉", "/n\0l"].freeze
  POSITIONS = [nil, -1, -2, 0, 1, 2, 3, 100].freeze
  MSGPACK = "application/vnd.msgpack"

  def setup
    super
    @bus.close
    @store = CountingStore.new
    @bus = Herald::Bus.new(store: @store)
  end

  def test_a_repeated_poll_is_answered_without_reading_the_store_until_a_publish
    m = mock(mw = middleware)
    @bus.publish("/chat", "première ✓")
    first = poll(m, {"/chat" => 0}, query: "dlp=t")
    reads = @store.reads
    second = poll(m, {"/chat" => 0}, client: "c2", query: "dlp=t")
    assert_equal reads, @store.reads, "the second poll read nothing from the store"
    assert_equal [200, first.headers, first.body], [second.status, second.headers, second.body]
    assert_equal ["première ✓"], ids(JSON.parse(second.body))
    assert_equal 1, mw.reply_cache.size
    @bus.publish("/chat", "deuxième 🎉")
    third = poll(m, {"/chat" => 0}, client: "c3", query: "dlp=t")
    assert_equal ["première ✓", "deuxième 🎉"], ids(JSON.parse(third.body)), "a publish in between: no stale bytes"
    assert_operator @store.reads, :>, reads
    assert_equal 400, poll(m, {"/chat" => 0}, client: "bad!id", query: "dlp=t").status, "the client id is still checked"
    assert_equal 413, poll(m, {"/chat" => 0, "x" => "y" * 70_000}, query: "dlp=t").status
  end

  def test_off_with_reply_cache_false_and_for_per_client_lookups
    @bus.publish("/chat", "x")
    [{reply_cache: false}, {user_id_lookup: ->(_env) { 1 }}, {group_ids_lookup: ->(_env) { [1] }},
      {site_id_lookup: ->(_env) {}}, {client_message_filters: [["/chat", ->(_msg) { true }]]}].each do |options|
      m = mock(mw = middleware(**options))
      reads = @store.reads
      3.times { assert_equal ["x"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body)) }
      assert_equal 6, @store.reads - reads, "every poll read the store (#{options.keys.first})"
      assert_equal 0, mw.reply_cache&.size.to_i
    end
  end

  # The headers Hash and body Array are the caller's: a middleware in front may add to them (Rack::Runtime,
  # Rack::ETag, a CORS middleware do).
  def test_each_reply_has_its_own_headers_and_body_array
    mw = middleware
    @bus.publish("/chat", "x")
    env = -> { ::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", {:method => "POST", :input => "%2Fchat=0", "SERVER_PROTOCOL" => "HTTP/1.1"}) }
    status, headers, body = mw.call(env.call)
    headers["x-runtime"] = "0.1"
    body << "more"
    _, headers2, body2 = mw.call(env.call)
    refute headers2.key?("x-runtime")
    assert_equal 1, body2.size
    refute headers2.frozen?
    assert_equal [200, ["x"]], [status, ids(JSON.parse(body2.first))]
  end

  # A message for one client id is in that client's reply only; another client's reply has a status
  # (the position past what it will not get). Neither is ever shared.
  def test_targeted_messages_are_never_shared
    m = mock(middleware)
    @bus.publish("/chat", "for everyone ✓")
    @bus.publish("/chat", "for c1 only 🎉", client_ids: ["c1"])
    3.times do
      %w[c2 c1 c3 c1].each do |client|
        expected = (client == "c1") ? ["for everyone ✓", "for c1 only 🎉"] : ["for everyone ✓"]
        assert_equal expected, ids(JSON.parse(poll(m, {"/chat" => 0}, client: client, query: "dlp=t").body)), client
        assert_equal expected, ids(MessagePack.unpack(poll(m, {"/chat" => 0}, client: client, query: "dlp=t", HTTP_ACCEPT: MSGPACK).body)), client
      end
    end
  end

  def test_user_and_group_targets_with_lookups
    m = mock(middleware(user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i }, group_ids_lookup: ->(env) { env["HTTP_X_GROUPS"]&.split(",")&.map(&:to_i) }))
    @bus.publish("/chat", "u1", user_ids: [1])
    @bus.publish("/chat", "g7", group_ids: [7])
    @bus.publish("/chat", "all")
    readers = {{"HTTP_X_USER" => "1"} => %w[u1 all], {"HTTP_X_USER" => "2", "HTTP_X_GROUPS" => "7"} => %w[g7 all], {} => %w[all]}
    2.times do
      readers.each do |env, expected|
        assert_equal expected, ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t", **env).body)), env.inspect
      end
    end
  end

  def test_sites_with_a_site_lookup
    m = mock(middleware(site_id_lookup: ->(env) { env["HTTP_X_SITE"] }))
    @bus.publish("/chat", "site a", site_id: "a")
    @bus.publish("/chat", "site b", site_id: "b")
    2.times do
      %w[a b].each { |site| assert_equal ["site #{site}"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t", HTTP_X_SITE: site).body)) }
    end
  end

  # The body is shared between header sets; each reply carries its own request's headers.
  def test_extra_response_headers_are_looked_up_for_every_request
    lookups = 0
    mw = middleware(extra_response_headers_lookup: lambda do |env|
      lookups += 1
      {"Access-Control-Allow-Origin" => env["HTTP_ORIGIN"], "Vary" => "Origin"}
    end)
    m = mock(mw)
    @bus.publish("/chat", "cors ✓")
    origins = ["https://a.test", "https://b.test", "https://ü.test".b]
    3.times do
      origins.each do |origin|
        response = poll(m, {"/chat" => 0}, query: "dlp=t", HTTP_ORIGIN: origin)
        assert_equal origin, response.headers["access-control-allow-origin"]
        assert_equal ["cors ✓"], ids(JSON.parse(response.body))
        packed = poll(m, {"/chat" => 0}, query: "dlp=t", HTTP_ORIGIN: origin, HTTP_ACCEPT: MSGPACK)
        assert_equal [origin, MSGPACK, @store.epoch], packed.headers.values_at("access-control-allow-origin", "content-type", "herald-epoch")
        assert_equal "herald-epoch", packed.headers["access-control-expose-headers"]
        assert_equal ["cors ✓"], ids(MessagePack.unpack(packed.body))
      end
    end
    assert_equal 18, lookups
    assert_equal 2, mw.reply_cache.size, "one body per format, whatever the headers"
  end

  # The same channels asked in a form by a session middleware (Rack::MethodOverride reads the form first,
  # as in every Rails app): the key is the form Rack read, so different forms get different replies.
  def test_forms_read_by_method_override
    m = ::Rack::MockRequest.new(::Rack::Lint.new(::Rack::MethodOverride.new(middleware)))
    @bus.publish("/a", "on a")
    @bus.publish("/b", "on b ✓")
    3.times do
      assert_equal ["on a"], ids(JSON.parse(poll(m, "%2Fa=0", query: "dlp=t").body))
      assert_equal ["on b ✓"], ids(JSON.parse(poll(m, "%2Fb=0", query: "dlp=t").body))
      assert_equal ["on a", "on b ✓"], ids(JSON.parse(poll(m, "%2Fa=0&%2Fb=0", query: "dlp=t").body))
    end
  end

  # A long poll with a backlog is answered at once when the client cannot take a stream (Dont-Chunk, HTTP/1.0),
  # and streamed otherwise: the cached immediate reply must not answer the streaming request.
  def test_dont_chunk_and_streams
    m = mock(middleware)
    @bus.publish("/chat", "x")
    2.times do
      assert_equal ["x"], ids(JSON.parse(poll(m, {"/chat" => 0}, HTTP_DONT_CHUNK: "t").body))
      streamed = poll(m, {"/chat" => 0})
      assert_equal "text/plain; charset=utf-8", streamed.headers["content-type"]
      assert_equal [["x"], []], segments(streamed.body).map { |s| ids(s) }
    end
  end

  # rack.input need not rewind (Rack 3): the body read for the cache's key is the one the poll is parsed from,
  # also for a request the cache does not take (HTTP/1.0, forced channels aside).
  class OnceInput
    def initialize(body) = @body = body

    def read(*) = @body.tap { @body = nil }
  end

  def test_a_body_that_can_be_read_once
    mw = middleware
    @bus.publish("/chat", "once ✓")
    %w[HTTP/1.1 HTTP/1.0 HTTP/1.1].each do |version|
      env = ::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", {:method => "POST", "SERVER_PROTOCOL" => version,
        "CONTENT_TYPE" => JSON_TYPE, "rack.input" => OnceInput.new(JSON.generate("/chat" => 0))})
      _, _, body = mw.call(env)
      assert_equal ["once ✓"], ids(JSON.parse(body.join)), version
    end
  end

  # A message that ages out of its backlog is not served from the cache for more than a second.
  def test_entries_end_after_a_second
    m = mock(middleware)
    @bus.publish("/chat", "short-lived", max_backlog_age: 1)
    assert_equal ["short-lived"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body))
    sleep Herald::Rack::ReplyCache::MAX_AGE + 0.2
    assert_equal [], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body))
  end

  # The cached path builds its reply headers from a literal (Middleware#json_headers): they must be the
  # middleware's own, and a new unfrozen Hash each time (Rack 3; a middleware in front may add to them).
  def test_cached_replies_have_the_json_reply_headers
    mw = middleware
    @bus.publish("/chat", "x")
    m = mock(mw)
    2.times { poll(m, "/chat=0", query: "dlp=t") }
    want = Herald::Rack::Middleware::REPLY_HEADERS.fetch(Herald::Rack::Middleware::JSON_TYPE)
    a, b = Array.new(2) { mw.send(:json_headers) }
    assert_equal want, a
    refute a.frozen?
    refute a.equal?(b)
    env = ::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", :method => "POST", :input => "/chat=0", "CONTENT_TYPE" => FORM_TYPE, "SERVER_PROTOCOL" => "HTTP/1.1")
    reads = @store.reads
    status, headers, = mw.call(env)
    assert_equal reads, @store.reads, "answered from the cache"
    assert_equal [200, want], [status, headers]
  end

  # The body of a StringIO rack.input (Puma's, Rack::MockRequest's) is its String, taken as is: a poll, built
  # or answered from the cache, must leave it unchanged (bytes and encoding), non-ASCII JSON included.
  def test_a_string_io_body_is_left_as_it_was
    mw = middleware
    @bus.publish("/ü 🎉", "x")
    body = JSON.generate("/ü 🎉" => 0).b
    3.times do
      env = ::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", :method => "POST", :input => body.dup,
        "CONTENT_TYPE" => JSON_TYPE, "SERVER_PROTOCOL" => "HTTP/1.1")
      input = env["rack.input"].string
      before = [input.dup, input.encoding]
      status, _, parts = mw.call(env)
      assert_equal [200, ["x"]], [status, ids(JSON.parse(parts.join))]
      assert_equal before, [input, input.encoding]
    end
    assert_equal 1, mw.reply_cache.size, "the non-ASCII body was a key"
  end

  # Middleware#poll_path? keeps its answer per path, at most MAX_PATHS of them: past that it starts again,
  # and answers stay right (a refused id stays refused, a valid one is served from the cache).
  def test_kept_path_checks_stay_right_past_their_limit
    m = mock(mw = middleware)
    @bus.publish("/chat", "x")
    (Herald::Rack::Middleware::MAX_PATHS + 3).times do |i|
      assert_equal 200, poll(m, {"/chat" => 0}, client: "c#{i}", query: "dlp=t").status
    end
    reads = @store.reads
    2.times { assert_equal ["x"], ids(JSON.parse(poll(m, {"/chat" => 0}, client: "new", query: "dlp=t").body)) }
    assert_equal reads, @store.reads, "answered from the cache"
    assert_operator mw.instance_variable_get(:@poll_paths).size, :<=, Herald::Rack::Middleware::MAX_PATHS
    2.times { assert_equal 400, poll(m, {"/chat" => 0}, client: "bad!id", query: "dlp=t").status }
    2.times { assert_equal 400, poll(m, {"/chat" => 0}, client: "a" * 129, query: "dlp=t").status }
    long = "/message-bus/#{"b" * 128}/#{"z" * 80}" # longer than MAX_PATH_BYTES: checked every time, not kept
    2.times do
      got = m.post("#{long}?dlp=t", :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE, "SERVER_PROTOCOL" => "HTTP/1.1")
      assert_equal ["x"], ids(JSON.parse(got.body))
    end
    refute mw.instance_variable_get(:@poll_paths).key?(long)
  end

  def test_instrumented_polls_each_get_their_event
    m = mock(middleware)
    @bus.publish("/chat", "x")
    2.times { poll(m, {"/chat" => 0}, query: "dlp=t") }
    events = []
    sub = Herald::Instrumentation.subscribe("poll.herald") { |_name, payload, _| events << payload[:messages] }
    3.times { assert_equal ["x"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body)) }
    assert_equal [1, 1, 1], events
  ensure
    Herald::Instrumentation.unsubscribe(sub) if sub
  end

  # Herald.reset! (a new default bus): the old store's replies are never given for the new one's.
  def test_a_new_default_bus_gets_a_new_cache
    Herald.reset!
    Herald.configure { |c| c.store = Herald::Store::Memory.new }
    mw = Herald::Rack::Middleware.new(APP).tap { |x| @middlewares << x }
    m = mock(mw)
    Herald.publish("/chat", "old bus")
    assert_equal ["old bus"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body))
    Herald.reset!
    Herald.configure { |c| c.store = Herald::Store::Memory.new }
    Herald.publish("/chat", "new bus ✓")
    assert_equal ["new bus ✓"], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body))
  ensure
    Herald.reset!
  end

  # Randomized: polls from several clients on several channels and positions, JSON and form bodies, JSON
  # and MessagePack, with targeted and untargeted publishes in between; each request is answered by the
  # caching middleware and by one without a cache on the same bus, and the two answers must be the same.
  def test_randomized_against_the_uncached_middleware
    seed = Integer(ENV.fetch("SEED", rand(1 << 30)))
    rng = Random.new(seed)
    headers_lookup = ->(env) { env["HTTP_ORIGIN"] && {"Access-Control-Allow-Origin" => env["HTTP_ORIGIN"]} }
    user_lookup = ->(env) { env["HTTP_X_USER"]&.to_i }
    {"no lookups" => {}, "extra headers" => {extra_response_headers_lookup: headers_lookup},
     "user lookup" => {user_id_lookup: user_lookup}}.each do |name, options|
      cached = middleware(**options)
      plain = middleware(reply_cache: false, **options)
      hits = 0
      requests = []
      300.times do |step|
        publish_random(rng) if rng.rand < 0.08
        request = (requests.any? && rng.rand < 0.6) ? requests.last(6).sample(random: rng) : random_request(rng).tap { |r| requests << r }
        reads = @store.reads
        got = answer(cached, request)
        hits += 1 if @store.reads == reads && got[0] == 200 # a refused request reads nothing either
        want = answer(plain, request)
        assert_equal want, got, "SEED=#{seed} (#{name}, step #{step}): #{request.inspect}"
      end
      if name == "user lookup"
        assert_equal 0, hits, "SEED=#{seed}: nothing cached with a user lookup"
      else
        # 80 seeds: 14-58 hits, median ~35; SEED=590916741 gives 9 (few repeats between publishes). A cache
        # that never answers gives 0.
        assert_operator hits, :>=, 3, "SEED=#{seed} (#{name}): the cache answered"
      end
    end
  end

  private

  def publish_random(rng)
    targets = [{}, {}, {}, {client_ids: [CLIENTS.sample(random: rng)]}, {user_ids: [rng.rand(1..2)]}].sample(random: rng)
    @bus.publish(CHANNELS.sample(random: rng), DATA.sample(random: rng), **targets)
  end

  def random_request(rng)
    channels = CHANNELS.sample(rng.rand(1..3), random: rng).to_h { |c| [c, POSITIONS.sample(random: rng)] }
    body = if rng.rand < 0.5
      [JSON.generate(channels), JSON_TYPE]
    else
      [channels.map { |c, p| "#{CGI.escape(c)}=#{p}" }.join("&"), FORM_TYPE]
    end
    env = {"HTTP_ACCEPT" => [nil, MSGPACK].sample(random: rng), "HTTP_ORIGIN" => [nil, "https://a.test", "https://b.test"].sample(random: rng),
           "HTTP_X_USER" => [nil, "1", "2"].sample(random: rng)}.compact
    # Mostly valid client ids; some the middleware refuses (400) or does not route (404), which the path
    # check it keeps per path (Middleware#poll_path?) must answer as the uncached middleware does.
    client = (rng.rand < 0.85) ? CLIENTS.sample(random: rng) : ["bad!id", "a" * 129, "%C3%BC", "", "ok~id.-_"].sample(random: rng)
    {client: client, action: ["/poll", "/poll", "", "/x/y"].sample(random: rng), body: body, env: env}
  end

  def answer(mw, request)
    body, type = request[:body]
    env = ::Rack::MockRequest.env_for("/message-bus/#{request[:client]}#{request.fetch(:action, "/poll")}?dlp=t",
      {:method => "POST", :input => body, "CONTENT_TYPE" => type, "SERVER_PROTOCOL" => "HTTP/1.1"}.merge(request[:env]))
    status, headers, parts = mw.call(env)
    [status, headers.to_a.sort, parts.join.b]
  end
end
