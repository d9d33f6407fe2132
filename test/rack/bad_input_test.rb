# frozen_string_literal: true

require_relative "rack_helper"

# Every kind of bad input is a 4xx with a short message, never a 500, and the server keeps serving.
class BadInputTest < Minitest::Test
  include Herald::RackHelpers

  MAX_BODY = 1024

  # [name, body, content type, extra env/headers, expected status]
  CORPUS = [
    ["body over the limit", JSON.generate("/a" => 0, "/pad" => "x" * 2000), "application/json", {}, 413],
    ["too many channels", JSON.generate((1..11).to_h { |i| ["/c#{i}", 0] }), "application/json", {}, 400],
    ["invalid UTF-8 in JSON", "{\"/a\xff\":0}".b, "application/json", {}, 400],
    ["invalid UTF-8 in a form key", "%2Fa%FF=0", "application/x-www-form-urlencoded", {}, 400],
    ["invalid UTF-8 in a form value", "%2Fa=%C3%28", "application/x-www-form-urlencoded", {}, 400],
    ["malformed percent-encoding", "%2Fa=%zz", "application/x-www-form-urlencoded", {}, 400],
    ["raw invalid byte in a form key", "/ch\xFFat=1".b, "application/x-www-form-urlencoded", {}, 400],
    ["raw invalid byte in a form value", "/chat=\xFF".b, "application/x-www-form-urlencoded", {}, 400],
    ["raw invalid byte before a bad escape", "/a\xFF=%zz".b, "application/x-www-form-urlencoded", {}, 400],
    ["raw invalid byte with no content type", "/ch\xFFat=1".b, "", {}, 400],
    ["huge id", JSON.generate("/a" => 10**30), "application/json", {}, 400],
    ["huge negative id", JSON.generate("/a" => -10**30), "application/json", {}, 400],
    ["huge id as a string", "%2Fa=99999999999999999999999", "application/x-www-form-urlencoded", {}, 400],
    ["non-numeric id", "%2Fa=abc", "application/x-www-form-urlencoded", {}, 400],
    ["float id", JSON.generate("/a" => 1.5), "application/json", {}, 400],
    ["boolean id", JSON.generate("/a" => true), "application/json", {}, 400],
    ["array id", JSON.generate("/a" => [1]), "application/json", {}, 400],
    ["object id", JSON.generate("/a" => {"b" => 1}), "application/json", {}, 400],
    ["non-numeric __seq", JSON.generate("/a" => 0, "__seq" => "x"), "application/json", {}, 400],
    ["unknown content type", "<xml/>", "text/xml", {}, 415],
    ["multipart without its closing boundary", "--b\r\nContent-Disposition: form-data; name=\"/a\"\r\n\r\n0", "multipart/form-data; boundary=b", {}, 400],
    ["multipart over the limit", "--b\r\nContent-Disposition: form-data; name=\"/a\"\r\n\r\n#{"0" * 2000}\r\n--b--\r\n", "multipart/form-data; boundary=b", {}, 413],
    ["multipart with a file for an id", "--b\r\nContent-Disposition: form-data; name=\"/a\"; filename=\"x.txt\"\r\nContent-Type: text/plain\r\n\r\n0\r\n--b--\r\n", "multipart/form-data; boundary=b", {}, 400],
    ["multipart with invalid UTF-8 in a name", "--b\r\nContent-Disposition: form-data; name=\"/a\xFF\"\r\n\r\n0\r\n--b--\r\n".b, "multipart/form-data; boundary=b", {}, 400],
    ["malformed JSON", "{\"/a\": ", "application/json", {}, 400],
    ["JSON that is not an object", "[1,2]", "application/json", {}, 400],
    ["deeply nested JSON", "[" * 500 + "]" * 500, "application/json", {}, 400],
    ["empty channel name", JSON.generate("" => 0), "application/json", {}, 400],
    ["channel too long", JSON.generate("/#{"x" * 300}" => 0), "application/json", {}, 400],
    ["channel with the site separator", JSON.generate("/a$|$b" => 0), "application/json", {}, 400],
    # ActionCable's broadcastings (adapter: herald) reach only the clients its channels authorized.
    ["an ActionCable broadcasting", JSON.generate("/chat" => 0, Herald::Cable.channel("room") => 0), "application/json", {}, 403],
    ["an ActionCable broadcasting in a form", "%2Fherald%2Fcable%2Froom=-1", "application/x-www-form-urlencoded", {}, 403]
  ].freeze

  def test_corpus_through_rack_lint
    m = mock(middleware(max_body_bytes: MAX_BODY, max_channels: 10))
    CORPUS.each do |name, body, type, _env, status|
      response = m.post("/message-bus/c1/poll?dlp=t", :input => body, "CONTENT_TYPE" => type)
      assert_equal status, response.status, name
      assert_operator response.body.bytesize, :<, 120, name
      refute_empty response.body.strip, name
    end
  end

  def test_body_over_the_limit_without_content_length
    m = mock(middleware(max_body_bytes: MAX_BODY))
    env = ::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", :method => "POST", :input => "%2Fa=0&" * 500,
      "CONTENT_TYPE" => "application/x-www-form-urlencoded")
    env.delete("CONTENT_LENGTH")
    status, _, body = ::Rack::Lint.new(middleware(max_body_bytes: MAX_BODY)).call(env)
    assert_equal 413, status
    body.close if body.respond_to?(:close)
    assert_equal 200, m.post("/message-bus/c1/poll?dlp=t", input: "").status
  end

  def test_bad_client_ids_and_sse_inputs
    m = mock
    assert_equal 400, m.post("/message-bus/a%20b/poll?dlp=t", input: "").status
    assert_equal 400, m.post("/message-bus/#{"x" * 200}/poll?dlp=t", input: "").status
    assert_equal 400, m.get("/message-bus/c1/sse?%2Fa=x").status
    assert_equal 400, m.get("/message-bus/c1/sse?%2Fa=0", "HTTP_LAST_EVENT_ID" => "abc").status
    assert_equal 400, m.get("/message-bus/c1/sse?%2Fa=0", "HTTP_LAST_EVENT_ID" => "-5").status
    assert_equal 414, m.get("/message-bus/c1/sse?#{"%2Fa=0&" * 3000}").status
  end

  # Puma hands the query string over as binary (what Rack::Lint asks for); an app or server in front may hand
  # it over as UTF-8 (Rack::Lint refuses that, so that case skips Lint). A raw byte that is not UTF-8 is
  # refused either way, never raised on.
  def test_raw_invalid_bytes_in_an_sse_query_are_refused
    mw = middleware
    ["/ch\xFFat=1", "%2Fa=0&\xFF", "/a=%zz\xFF"].each do |query|
      assert_equal 400, mock(mw).get("/message-bus/c1/sse", "QUERY_STRING" => query.b).status, query.inspect
      env = ::Rack::MockRequest.env_for("/message-bus/c1/sse", "QUERY_STRING" => query.dup.force_encoding(Encoding::UTF_8))
      assert_equal 400, mw.call(env)[0], "#{query.inspect} as UTF-8"
    end
  end

  # The same corpus against a running Puma: all refused, then a normal poll and a parked stream still work.
  def test_corpus_over_a_socket_then_the_server_still_serves
    mw = middleware(max_body_bytes: MAX_BODY, max_channels: 10)
    server = puma(mw)
    parked_socket = server.request({"/live" => nil}, client: "watcher")
    Herald::PumaServer.read_until(parked_socket, "[]\r\n|\r\n")
    CORPUS.each do |name, body, type, _env, status|
      got, = Herald::PumaServer.read(server.request(body, path: "/message-bus/c1/poll?dlp=t", type: type))
      assert_equal status, got, name
    end
    @bus.publish("/live", "still here")
    Herald::PumaServer.read_until(parked_socket, "still here")
    _, _, body = Herald::PumaServer.read(server.request({"/live" => 0}, path: "/message-bus/c2/poll?dlp=t"))
    assert_equal ["still here"], ids(JSON.parse(body))
    assert mw.reactor.alive?
  ensure
    parked_socket&.close
  end

  # The app behind the middleware raising is the app's business (its server or framework reports it):
  # not given to on_middleware_error, not logged as a transport error, as in message_bus.
  def test_errors_of_the_app_behind_are_not_middleware_errors
    hooked = []
    app = ->(_env) { raise KeyError, "the app's own" }
    mw = Herald::Rack::Middleware.new(app, bus: @bus, user_id_lookup: ->(_env) { raise ArgumentError, "lookup" },
      on_middleware_error: ->(_env, e) { (hooked << e) && [503, {}, ["hooked"]] })
    @middlewares << mw
    _, err = capture_io do
      error = assert_raises(KeyError) { mw.call(::Rack::MockRequest.env_for("/elsewhere")) }
      assert_equal "the app's own", error.message
    end
    assert_empty hooked
    refute_match(/http transport/, err)
    status, = mw.call(::Rack::MockRequest.env_for("/message-bus/c1/poll?dlp=t", method: "POST", input: "%2Fa=0"))
    assert_equal 503, status, "the middleware's own errors still go to the hook"
    assert_equal ["lookup"], hooked.map(&:message)
  end

  # A client message filter that raises drops that client only; the fan-out goes on for the others.
  def test_a_failing_filter_never_stops_the_event_loop
    errors = []
    filter = lambda do |msg|
      raise "boom" if msg.data == "explode"
      true
    end
    mw = middleware(client_message_filters: [["/chat", filter]], on_error: ->(e) { errors << e }, long_polling_interval: 3)
    m = mock(mw)
    first = in_thread { poll(m, {"/chat" => nil}, client: "a", HTTP_DONT_CHUNK: "t") }
    parked(mw)
    @bus.publish("/chat", "explode")
    first.join(3)
    assert_equal ["boom"], errors.map(&:message)
    second = in_thread { poll(m, {"/chat" => nil}, client: "b", HTTP_DONT_CHUNK: "t") }
    parked(mw)
    @bus.publish("/chat", "fine")
    assert_equal ["fine"], ids(JSON.parse(second.value.body))
    assert mw.reactor.alive?
  end
end
