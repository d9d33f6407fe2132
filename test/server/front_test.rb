# frozen_string_literal: true

require "test_helper"
require "json"
require "socket"
require "logger"
require "stringio"
require "herald/server"
require_relative "../rack/rack_helper" # Herald::PumaServer.read_raw, read_until, dechunk

# Herald::Server::Front, `herald server`'s HTTP front end, over raw sockets: keep-alive and pipelining,
# request framing and limits, the slowloris timeout, and the split between the event loop (message-bus
# requests) and the thread pool (the app).
class FrontTest < Minitest::Test
  POLL = "/message-bus/c1/poll?dlp=t"

  def setup
    @bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    @gate = Queue.new
    app = lambda do |env|
      case env["PATH_INFO"]
      when "/slow" then [200, {"content-type" => "text/plain"}, [@gate.pop]]
      when "/echo" then [200, {"content-type" => "application/octet-stream"}, [env["rack.input"].read]]
      when "/stream" then [200, {"content-type" => "text/plain"}, Enumerator.new { |y| y << "one " << "two" }]
      when "/callable" then [200, {"content-type" => "text/plain"}, ->(stream) { stream.write("called ✓") }]
      when "/broken" then [200, {"content-type" => "text/plain"}, Enumerator.new { |y| y << "part" and raise KeyError, "broken body" }]
      when "/env" then [200, {"content-type" => "application/json"}, [JSON.generate(env.slice("SERVER_NAME", "SERVER_PORT", "QUERY_STRING", "PATH_INFO", "REMOTE_ADDR", "SERVER_PROTOCOL"))]]
      else [404, {"content-type" => "text/plain"}, ["not here"]]
      end
    end
    @mw = Herald::Rack::Middleware.new(app, bus: @bus, long_polling_interval: 1)
    @front = Herald::Server::Front.new(app: @mw, inline: ->(path) { path.start_with?(@mw.prefix) }, host: "127.0.0.1",
      port: 0, threads: 2, max_request_bytes: 1000, timeout: 1).start
    @sockets = []
  end

  def teardown
    @sockets.each { |s| s.close unless s.closed? }
    @gate << "bye" while @gate.num_waiting > 0
    @front.stop
    @mw.close
    @bus.close
  end

  def test_keep_alive_and_pipelined_requests_are_answered_in_order_on_one_connection
    @bus.publish("/chat", "héllo 🎉")
    body = "%2Fchat=0"
    poll = "POST #{POLL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}"
    socket = connect
    socket.write(poll + "GET /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\na\0b" + poll + "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    replies = read_replies(socket, 4)
    assert_equal [200, 200, 200, 404], replies.map(&:first)
    assert_equal "héllo 🎉", JSON.parse(replies[0][2].force_encoding("UTF-8")).first["data"]
    assert_equal "a\0b", replies[1][2]
    assert_equal replies[0][2].b, replies[2][2].b
    socket.write("GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, = read_replies(socket, 1).first
    assert_equal 404, status
    assert_equal "close", headers["connection"]
    assert_nil socket.wait_readable(2) && socket.read_nonblock(1, exception: false), "closed after Connection: close"
  end

  def test_http_1_0_closes_unless_keep_alive_is_asked
    socket = connect
    socket.write("GET /nope HTTP/1.0\r\n\r\n")
    raw = socket.read
    assert_match(/\AHTTP\/1\.0 404 Not Found\r\n/, raw)
    socket = connect
    socket.write("GET /nope HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    status, headers, = read_replies(socket, 1).first
    assert_equal [404, "keep-alive"], [status, headers["connection"]]
  end

  def test_a_slow_app_request_never_holds_up_polls
    slow = connect
    slow.write("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    sleep 0.1
    started = now
    3.times do
      socket = connect
      socket.write("POST #{POLL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
      assert_equal 200, read_replies(socket, 1).first.first
    end
    assert_operator now - started, :<, 1, "polls waited for the app"
    @gate << "done"
    status, _, body = read_replies(slow, 1).first
    assert_equal [200, "done"], [status, body]
  end

  def test_a_parked_poll_is_handed_to_the_middleware_event_loop
    socket = connect
    socket.write("POST /message-bus/c1/poll HTTP/1.1\r\nHost: x\r\nDont-Chunk: true\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"/chat\":0}")
    eventually { @mw.active_clients == 1 }
    @bus.publish("/chat", {"n" => 1})
    raw = Herald::PumaServer.read_raw(socket)
    assert_match(/\AHTTP\/1\.1 200 OK\r\n.*connection: close\r\n/m, raw)
    assert_equal [{"n" => 1}], JSON.parse(raw.split("\r\n\r\n", 2).last).map { |m| m["data"] }
  end

  def test_a_streaming_body_is_chunked
    socket = connect
    socket.write("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = Herald::PumaServer.read_until(socket, "0\r\n\r\n")
    assert_includes raw, "transfer-encoding: chunked\r\n"
    assert_equal ["one ", "two"], Herald::PumaServer.dechunk(raw.split("\r\n\r\n", 2).last)
  end

  # A Rack 3 callable body writes to the socket and the connection closes after it; a body that raises
  # midway ends its connection and the pool thread serves the next request.
  def test_callable_and_failing_bodies
    socket = connect
    socket.write("GET /callable HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = Herald::PumaServer.read_raw(socket).force_encoding("UTF-8")
    assert_match(/\AHTTP\/1\.1 200 OK\r\n.*connection: close\r\n\r\ncalled ✓\z/m, raw)
    log = StringIO.new
    previous = Herald.logger
    Herald.logger = Logger.new(log)
    2.times do
      socket = connect
      socket.write("GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
      assert_includes Herald::PumaServer.read_raw(socket), "part"
    end
    assert_match(/ERROR -- : http server: Rack app: KeyError: broken body/, log.string)
    socket = connect
    socket.write("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 404, read_replies(socket, 1).first.first, "the pool still serves"
  ensure
    Herald.logger = previous if previous
  end

  def test_chunked_request_bodies_and_expect_continue
    socket = connect
    socket.write("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert_equal "HTTP/1.1 100 Continue\r\n\r\n", socket.readpartial(100)
    socket.write("3;ext=1\r\nab\0\r\n4\r\n🎉\r\n0\r\nTrailer: x\r\n\r\n".b)
    status, _, body = read_replies(socket, 1).first
    assert_equal [200, "ab\0🎉".b], [status, body.b]
  end

  # RFC 9110 10.1.1: a server MUST ignore a 100-continue expectation in an HTTP/1.0 request.
  def test_no_100_continue_for_http_1_0
    socket = connect
    socket.write("POST /echo HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert_nil socket.wait_readable(0.3), "an HTTP/1.0 client was sent 100 Continue"
    socket.write("ok")
    status, _, body = read_replies(socket, 1).first
    assert_equal [200, "ok"], [status, body]
  end

  # The status Puma's parser limits map to, and what the front end refuses itself; never a 5xx.
  def test_limits_and_malformed_requests
    {
      "GET /#{"a" * 9000} HTTP/1.1\r\n\r\n" => 414,
      "GET / HTTP/1.1\r\nX: #{"a" * 90_000}\r\n\r\n" => 431,
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n" => 413,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" => 413,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" => 501, # RFC 9112 6.1
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" => 400, # RFC 9112 6.3: chunked not final
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" => 400,
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n" => 400,
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" => 400,
      "GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n" => 400,
      "\r\n\r\n" => 400
    }.each do |request, expected|
      socket = connect
      socket.write(request)
      status, headers, body = read_replies(socket, 1).first
      assert_equal expected, status, request[0, 80].inspect
      assert_equal "close", headers["connection"]
      assert_match(/\A#{expected} /, body)
    end
  end

  # Slowloris: a request not complete within the timeout is answered 408 and closed; an idle keep-alive
  # connection is closed; neither holds anything.
  def test_incomplete_and_idle_connections_time_out
    partial = connect
    partial.write("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n")
    idle = connect
    idle.write("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 404, read_replies(idle, 1).first.first
    trickle = connect
    trickle.write("GET /nope HTTP/1.1\r\n")
    started = now
    3.times do
      sleep 0.4
      trickle.write("X: y\r\n") # bytes keep coming, but the request never ends
    end
    assert_equal 408, read_replies(partial, 1).first.first
    assert_equal 408, read_replies(trickle, 1).first.first
    assert idle.wait_readable(3)
    assert_nil idle.read_nonblock(1, exception: false)
    assert_operator now - started, :<, 3
  end

  # A graceful stop: the request the pool holds is answered (`connection: close`) before the loop ends, an
  # idle keep-alive connection gets a FIN (no reset), a request sent after the stop began is not run, and
  # new connections are refused.
  def test_stop_answers_what_the_pool_holds_and_ends_the_rest_cleanly
    slow = connect
    slow.write("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    idle = connect
    idle.write("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_equal 404, read_replies(idle, 1).first.first
    eventually { @gate.num_waiting == 1 }
    stopper = Thread.new { @front.stop(grace: 5) }
    eventually { idle.wait_readable(0) }
    assert_nil idle.read_nonblock(1, exception: false), "the idle connection is ended with a FIN"
    idle.write("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n") # too late: read and dropped, never run
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", @front.port) }
    assert stopper.alive?, "the stop waits for the pool's request"
    @gate << "finished"
    status, headers, body = read_replies(slow, 1).first
    assert_equal [200, "close", "finished"], [status, headers["connection"], body]
    assert stopper.join(5), "the stop returns once the reply is written"
  end

  def test_the_rack_env
    socket = connect
    socket.write("GET /env?a=%20b HTTP/1.1\r\nHost: example.org:8080\r\n\r\nGET http://other/env HTTP/1.1\r\nHost: [::1]:9\r\n\r\n")
    (_, _, first), (_, _, second) = read_replies(socket, 2)
    assert_equal({"SERVER_NAME" => "example.org", "SERVER_PORT" => "8080", "QUERY_STRING" => "a=%20b", "PATH_INFO" => "/env",
      "REMOTE_ADDR" => "127.0.0.1", "SERVER_PROTOCOL" => "HTTP/1.1"}, JSON.parse(first))
    assert_equal ["[::1]", "9", "/env"], JSON.parse(second).values_at("SERVER_NAME", "SERVER_PORT", "PATH_INFO")
  end

  private

  def connect = TCPSocket.new("127.0.0.1", @front.port).tap { |s| @sockets << s }

  # Reads `count` whole responses (Content-Length or close-delimited bodies): [[status, headers, body], ...].
  def read_replies(socket, count, timeout: 5)
    buffer = +"".b
    replies = []
    deadline = now + timeout
    while replies.size < count
      while (reply = take_reply(buffer))
        replies << reply
      end
      break if replies.size >= count
      left = deadline - now
      flunk "only #{replies.size} of #{count} replies within #{timeout}s: #{buffer[0, 300].inspect}" if left <= 0
      next unless socket.wait_readable(left)
      chunk = socket.read_nonblock(65_536, exception: false)
      if chunk.nil?
        replies << parse_reply(buffer) unless buffer.empty?
        break
      end
      buffer << chunk if chunk.is_a?(String)
    end
    replies
  end

  def take_reply(buffer)
    head_end = buffer.index("\r\n\r\n") or return nil
    status, headers = parse_head(buffer.byteslice(0, head_end))
    length = headers["content-length"] or return nil
    total = head_end + 4 + length.to_i
    return nil if buffer.bytesize < total
    body = buffer.byteslice(head_end + 4, length.to_i)
    buffer.replace(buffer.byteslice(total, buffer.bytesize - total))
    [status, headers, body]
  end

  def parse_reply(buffer)
    head, body = buffer.split("\r\n\r\n", 2)
    [*parse_head(head), body]
  end

  def parse_head(head)
    lines = head.split("\r\n")
    [lines.shift[/\AHTTP\/1\.[01] (\d+)/, 1].to_i, lines.to_h { |l| l.split(": ", 2).then { |k, v| [k.downcase, v] } }]
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
