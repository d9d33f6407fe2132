# frozen_string_literal: true

require_relative "rack_helper"

# docs/protocol.md 1.12, every MUST, through Rack::Lint with Rack::MockRequest (no hijack: parked clients are
# held by a blocking body). The same cases over a real socket are in middleware_socket_test.rb.
class MiddlewareTest < Minitest::Test
  include Herald::RackHelpers

  # MUST 1: routing by client id; the /poll suffix is not checked; empty id is 404; other paths go to the app.
  def test_routes_by_client_id_and_passes_other_paths_to_the_app
    m = mock
    @bus.publish("/chat", "a")
    %w[/message-bus/ABC /message-bus/ABC/poll /message-bus/ABC/anything].each do |path|
      response = m.post("#{path}?dlp=t", :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE)
      assert_equal ["a"], ids(JSON.parse(response.body)), path
    end
    response = m.post("/message-bus/", input: "")
    assert_equal [404, "not found"], [response.status, response.body]
    assert_equal "the app", m.get("/other").body
    assert_equal "the app", m.get("/message-busy/x").body
  end

  def test_base_route
    m = mock(middleware(base_route: "/sub"))
    @bus.publish("/chat", "a")
    assert_equal "the app", m.post("/message-bus/c/poll?dlp=t", input: "").body
    response = m.post("/sub/message-bus/c/poll?dlp=t", :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE)
    assert_equal ["a"], ids(JSON.parse(response.body))
  end

  # MUST 2: form and JSON bodies, __seq, int / string / "" / null values.
  def test_form_and_json_bodies
    m = mock
    3.times { |i| @bus.publish("/a", i) }
    @bus.publish("/b", "b")
    form = poll(m, "%2Fa=1&%2Fb=0&__seq=7", query: "dlp=t")
    assert_equal [1, 2, "b"], ids(JSON.parse(form.body))
    json = poll(m, {"/a" => "1", "/b" => nil, "__seq" => 3}, query: "dlp=t")
    assert_equal [1, 2], ids(JSON.parse(json.body))
    empty = poll(m, {"/a" => ""}, query: "dlp=t")
    assert_equal [], JSON.parse(empty.body), "\"\" means from now, with no status"
  end

  # MUST 3: the five last-id cases.
  def test_last_id_minus_one_gives_status_only
    m = mock
    2.times { |i| @bus.publish("/chat", i) }
    body = JSON.parse(poll(m, {"/chat" => -1}, query: "dlp=t").body)
    assert_equal [{"global_id" => -1, "message_id" => -1, "channel" => "/__status", "data" => {"/chat" => 2}}], body
  end

  def test_lookbehind
    m = mock
    5.times { |i| @bus.publish("/chat", i) }
    assert_equal [4], ids(JSON.parse(poll(m, {"/chat" => -2}, query: "dlp=t").body))
    assert_equal [3, 4], ids(JSON.parse(poll(m, {"/chat" => -3}, query: "dlp=t").body))
    assert_equal [0, 1, 2, 3, 4], ids(JSON.parse(poll(m, {"/chat" => -100}, query: "dlp=t").body))
  end

  def test_up_to_date_waits_and_times_out_with_empty_array
    m = mock
    @bus.publish("/chat", 0)
    started = monotonic
    response = poll(m, {"/chat" => 1}, HTTP_DONT_CHUNK: "t")
    assert_in_delta 0.5, monotonic - started, 0.3
    assert_equal "[]", response.body
    assert_equal "[]", poll(m, {"/chat" => 1}, query: "dlp=t").body
  end

  def test_client_ahead_is_reset_with_status
    m = mock
    @bus.publish("/chat", 0)
    body = JSON.parse(poll(m, {"/chat" => 10}, query: "dlp=t").body)
    assert_equal({"/chat" => 1}, status_of(body))
    assert_equal [], ids(body)
  end

  def test_backlog_between_zero_and_last
    m = mock
    4.times { |i| @bus.publish("/chat", i) }
    assert_equal [2, 3], ids(JSON.parse(poll(m, {"/chat" => 2}, query: "dlp=t").body))
    assert_equal [0, 1, 2, 3], ids(JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t").body))
  end

  # MUST 4: key order and ids.
  def test_reply_shape_and_key_order
    @bus.publish("/other", 1)
    @bus.publish("/chat", {"x" => [1, 2]})
    body = poll(mock, {"/chat" => 0}, query: "dlp=t").body
    assert_equal %([{"global_id":2,"message_id":1,"channel":"/chat","data":{"x":[1,2]}}]), body
  end

  # MUST 5: status for a filtered message (1.7 c), appended last.
  def test_status_when_a_backlog_message_is_withheld
    m = mock(middleware(user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i }))
    @bus.publish("/chat", "public")
    @bus.publish("/chat", "for 5", user_ids: [5])
    other = JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t", HTTP_X_USER: "6").body)
    assert_equal ["public"], ids(other)
    assert_equal({"/chat" => 2}, status_of(other))
    assert_equal "/__status", other.last["channel"]
    mine = JSON.parse(poll(m, {"/chat" => 0}, query: "dlp=t", HTTP_X_USER: "5").body)
    assert_equal ["public", "for 5"], ids(mine)
    assert_nil status_of(mine)
  end

  # MUST 6 and 11: exact content types, cache headers, extra headers, OPTIONS.
  def test_headers_content_types_and_options
    m = mock(middleware(extra_response_headers_lookup: ->(_env) { {"Access-Control-Allow-Origin" => "https://x.test", "Bad" => "a\r\nb: c"} }))
    response = poll(m, {}, query: "dlp=t")
    assert_equal "application/json; charset=utf-8", response.headers["content-type"]
    assert_equal "must-revalidate, private, max-age=0", response.headers["cache-control"]
    assert_equal "no-cache", response.headers["pragma"]
    assert_equal "0", response.headers["expires"]
    assert_equal "https://x.test", response.headers["access-control-allow-origin"]
    refute response.headers.key?("bad"), "header values with CR/LF are dropped"
    options = m.request("OPTIONS", "/message-bus/c1/poll")
    assert_equal [200, "OK"], [options.status, options.body]
    assert_equal "https://x.test", options.headers["access-control-allow-origin"]
    streamed = poll(m, {"/chat" => nil})
    assert_equal "text/plain; charset=utf-8", streamed.headers["content-type"]
    assert_equal "nosniff", streamed.headers["x-content-type-options"]
  end

  # MUST 7 (through a Rack body: the server does the HTTP framing): first chunk `[]`, each message its own
  # chunk, escaped separator, final `[]`.
  def test_streamed_segments
    mw = middleware
    m = mock(mw)
    @bus.publish("/chat", "old")
    request = in_thread { poll(m, {"/chat" => 1}) }
    parked(mw)
    @bus.publish("/chat", "one\r\n|\r\ntwo")
    @bus.publish("/chat", "three")
    body = request.value.body
    assert_equal [[], [{"global_id" => 2, "message_id" => 2, "channel" => "/chat", "data" => "one\r\n|\r\ntwo"}]], segments(body).first(2)
    assert_equal [["three"], []], segments(body).drop(2).map { |s| ids(s) }
  end

  def test_streamed_backlog_is_the_first_chunk
    @bus.publish("/chat", "old")
    body = poll(mock, {"/chat" => 0}).body
    assert_equal [["old"], []], segments(body).map { |s| ids(s) }
  end

  # MUST 8: immediate replies on dlp=t, for non-streaming clients with backlog, and over the client limit.
  def test_immediate_replies
    m = mock
    @bus.publish("/chat", "a")
    started = monotonic
    assert_equal ["a"], ids(JSON.parse(poll(m, {"/chat" => 0}, HTTP_DONT_CHUNK: "t").body))
    assert_equal "[]", poll(m, {"/chat" => 1}, query: "dlp=t").body
    http10 = poll(m, {"/chat" => 0}, SERVER_PROTOCOL: "HTTP/1.0")
    assert_equal "application/json; charset=utf-8", http10.headers["content-type"]
    assert_operator monotonic - started, :<, 0.4
  end

  def test_over_max_active_clients_answers_429_or_the_backlog
    mw = middleware(max_active_clients: 1)
    m = mock(mw)
    @bus.publish("/chat", "a")
    waiting = in_thread { poll(m, {"/chat" => 1}, client: "first", HTTP_DONT_CHUNK: "t") }
    parked(mw)
    refused = poll(m, {"/chat" => 1}, client: "second", HTTP_DONT_CHUNK: "t")
    assert_equal 429, refused.status
    assert_equal "15", refused.headers["retry-after"]
    with_backlog = poll(m, {"/chat" => 0}, client: "third")
    assert_equal ["a"], ids(JSON.parse(with_backlog.body))
    assert_equal "[]", waiting.value.body
  end

  # MUST 10: supersede by __seq; ties go to the new request.
  def test_newer_seq_supersedes_older_poll
    mw = middleware(long_polling_interval: 3)
    m = mock(mw)
    old = in_thread { poll(m, {"/chat" => nil, "__seq" => 1}, HTTP_DONT_CHUNK: "t") }
    parked(mw)
    started = monotonic
    newer = in_thread { poll(m, {"/chat" => nil, "__seq" => 2}, HTTP_DONT_CHUNK: "t") }
    assert_equal "[]", old.value.body
    assert_operator monotonic - started, :<, 1
    parked(mw)
    stale = poll(m, {"/chat" => nil, "__seq" => 1}, HTTP_DONT_CHUNK: "t")
    assert_equal "[]", stale.body
    assert_operator monotonic - started, :<, 1.5, "an older seq is answered at once"
    @bus.publish("/chat", "for the newest")
    assert_equal ["for the newest"], ids(JSON.parse(newer.value.body))
  end

  def test_tie_goes_to_new_request
    mw = middleware(long_polling_interval: 3)
    m = mock(mw)
    old = in_thread { poll(m, {"/chat" => nil}, HTTP_DONT_CHUNK: "t") }
    parked(mw)
    newer = in_thread { poll(m, {"/chat" => nil}, HTTP_DONT_CHUNK: "t") }
    assert_equal "[]", old.value.body
    parked(mw)
    @bus.publish("/chat", "x")
    assert_equal ["x"], ids(JSON.parse(newer.value.body))
  end

  # SHOULD: env["message_bus.channels"], session skip.
  def test_forced_channels_and_session_skip
    seen = nil
    mw = Herald::Rack::Middleware.new(APP, bus: @bus, long_polling_interval: 0.5)
    @middlewares << mw
    upstream = lambda do |env|
      env["message_bus.channels"] = {"/forced" => 0}
      env["rack.session.options"] = {} # as a session middleware in front would have
      mw.call(env).tap { seen = env["rack.session.options"] }
    end
    @bus.publish("/forced", "f")
    response = ::Rack::MockRequest.new(::Rack::Lint.new(upstream)).post("/message-bus/c/poll?dlp=t", :input => JSON.generate("/x" => 0), "CONTENT_TYPE" => JSON_TYPE)
    assert_equal ["f"], ids(JSON.parse(response.body))
    assert_equal true, seen[:skip]
  end

  def test_live_message_reaches_a_parked_poll_within_milliseconds
    mw = middleware(long_polling_interval: 5)
    m = mock(mw)
    request = in_thread { poll(m, {"/chat" => nil}, HTTP_DONT_CHUNK: "t") }
    parked(mw)
    started = monotonic
    @bus.publish("/chat", "now")
    assert_equal ["now"], ids(JSON.parse(request.value.body))
    assert_operator monotonic - started, :<, 0.5
  end

  # MUST 9: 25 s by default, as message_bus.
  def test_default_hold_is_25_seconds
    assert_equal 25, Herald::Rack::Middleware::DEFAULTS[:long_polling_interval]
    assert_equal 25, Herald::Rack::Middleware.new(APP, bus: @bus).options[:long_polling_interval]
  end

  # MUST 12: client message filters run on channels with their prefix, last registered first; the first
  # false denies (a withheld backlog message puts the channel in the status).
  def test_client_message_filters_order_and_prefix
    calls = []
    first = ->(msg) { calls << :first && msg.data != "hidden by first" }
    last = ->(msg) { (calls << :last) && msg.data != "hidden by last" }
    m = mock(middleware(client_message_filters: [["/a", first], ["/a", last]]))
    @bus.publish("/a", "shown")
    @bus.publish("/a", "hidden by first")
    @bus.publish("/a", "hidden by last")
    @bus.publish("/b", "hidden by last")
    body = JSON.parse(poll(m, {"/a" => 0, "/b" => 0}, query: "dlp=t").body)
    assert_equal ["shown", "hidden by last"], ids(body), "filters only apply to channels starting with their prefix"
    assert_equal({"/a" => 3}, status_of(body))
    assert_equal %i[last first last first last], calls, "reverse registration order; the first false stops"
  end

  def test_unknown_option_is_refused
    error = assert_raises(Herald::InvalidArgumentError) { Herald::Rack::Middleware.new(APP, bus: @bus, long_poling_interval: 1) }
    assert_includes error.message, ":long_poling_interval"
  end

  private

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
