# frozen_string_literal: true

require_relative "rack_helper"
require "falcon"
require "async"
require "async/http/endpoint"

# Under Falcon (a fiber scheduler, Rack 3) parked clients are Rack 3 streaming bodies (`call(stream)`):
# a fiber each, woken by the one event loop; Falcon does the HTTP framing.
class FalconTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer

  def setup
    super
    @mw = middleware(long_polling_interval: 1)
    @mw.reactor # started up front, so thread counts below compare like with like
    @port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    ready = Queue.new
    @stop, stopper = IO.pipe
    @stopper = stopper
    @thread = Thread.new do
      Async do |task|
        endpoint = Async::HTTP::Endpoint.parse("http://127.0.0.1:#{@port}")
        server = Falcon::Server.new(Falcon::Server.middleware(@mw), endpoint)
        serving = task.async { server.run }
        ready << true
        @stop.wait_readable # fiber-aware: Falcon keeps serving meanwhile
        serving.stop
      end
    end
    ready.pop
    @client = Server.allocate.tap { |s| s.instance_variable_set(:@port, @port) }
    eventually { TCPSocket.new("127.0.0.1", @port).close || true rescue false } # rubocop:disable Style/RescueModifier
  end

  def teardown
    @stopper.write("x")
    @thread.join(5)
    super
  end

  def test_chunked_stream_through_a_streaming_body
    @bus.publish("/chat", "old")
    socket = @client.request({"/chat" => 0})
    parked(@mw)
    threads_before = Thread.list.size
    @bus.publish("/chat", "new")
    status, headers, body = Server.read(socket)
    assert_equal 200, status
    assert_equal "text/plain; charset=utf-8", headers.to_h["content-type"]
    assert_equal [["old"], ["new"], []], segments(Server.dechunk(body).join).map { |s| ids(s) }
    assert_operator Thread.list.size, :<=, threads_before
  end

  def test_many_long_polls_park_as_fibers_not_threads
    threads_before = Thread.list.size
    sockets = Array.new(30) { |i| @client.request({"/chat" => nil}, client: "c#{i}", headers: {"Dont-Chunk" => "t"}) }
    parked(@mw, 30)
    assert_operator Thread.list.size, :<=, threads_before
    @bus.publish("/chat", "all")
    sockets.each do |socket|
      _, headers, body = Server.read(socket)
      assert_equal "application/json; charset=utf-8", headers.to_h["content-type"]
      assert_equal ["all"], ids(JSON.parse(Server.dechunk(body).join))
    end
  end

  # The streaming body itself through Rack::Lint (Rack 3 checks `call(stream)` bodies), under a fiber scheduler.
  def test_streaming_body_passes_rack_lint
    @bus.publish("/chat", "old")
    response = nil
    Sync do
      refute_nil Fiber.scheduler, "the middleware answers with a streaming body only under a fiber scheduler"
      response = ::Rack::MockRequest.new(::Rack::Lint.new(@mw)).post("/message-bus/lint/poll",
        :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE, "SERVER_PROTOCOL" => "HTTP/1.1")
    end
    assert_equal 200, response.status
    assert_equal [["old"], []], segments(response.body).map { |s| ids(s) }
  end

  def test_sse_through_a_streaming_body
    socket = @client.request("", method: "GET", type: nil, path: "/message-bus/c1/sse?%2Fchat=")
    parked(@mw)
    @bus.publish("/chat", "event")
    assert_includes Server.read_until(socket, "event\"}"), "data: {\"global_id\":1,\"message_id\":1,\"channel\":\"/chat\",\"data\":\"event\"}"
    socket.close
  end
end
