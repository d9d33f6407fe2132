# frozen_string_literal: true

require_relative "rack_helper"

# docs/protocol.md 1.12 over a real socket: Puma in this process, full hijack, our own HTTP framing.
class MiddlewareSocketTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer

  def test_chunked_stream_bytes_on_the_wire
    mw = middleware
    server = puma(mw)
    @bus.publish("/chat", "old")
    socket = server.request({"/chat" => 0})
    first = Server.read_until(socket, "\r\n|\r\n\r\n")
    assert_includes first, "HTTP/1.1 200 OK\r\ncache-control: must-revalidate, private, max-age=0\r\npragma: no-cache\r\nexpires: 0\r\n" \
      "connection: close\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\nx-content-type-options: nosniff\r\n\r\n"
    parked(mw)
    @bus.publish("/chat", "a\r\n|\r\nb")
    body = Server.read_raw(socket)
    chunks = Server.dechunk(first.split("\r\n\r\n", 2).last + body)
    assert_equal [
      %([{"global_id":1,"message_id":1,"channel":"/chat","data":"old"}]\r\n|\r\n),
      %([{"global_id":2,"message_id":2,"channel":"/chat","data":"a\\r\\n|\\r\\nb"}]\r\n|\r\n),
      "[]\r\n|\r\n"
    ], chunks
    assert body.end_with?("0\r\n\r\n")
  end

  def test_first_chunk_is_empty_array_at_once
    server = puma
    started = monotonic
    socket = server.request({"/chat" => nil})
    got = Server.read_until(socket, "7\r\n[]\r\n|\r\n\r\n")
    assert_operator monotonic - started, :<, 1, "first chunk within 3 s (here: at once)"
    assert got.start_with?("HTTP/1.1 200 OK")
    socket.close
  end

  def test_non_chunked_long_poll_reply_and_timeout
    mw = middleware
    server = puma(mw)
    socket = server.request({"/chat" => nil}, headers: {"Dont-Chunk" => "true"})
    parked(mw)
    @bus.publish("/chat", "x")
    status, headers, body = Server.read(socket)
    assert_equal 200, status
    assert_equal [["cache-control", "must-revalidate, private, max-age=0"], ["pragma", "no-cache"], ["expires", "0"],
      ["connection", "close"], ["content-type", "application/json; charset=utf-8"], ["content-length", body.bytesize.to_s]], headers
    assert_equal %([{"global_id":1,"message_id":1,"channel":"/chat","data":"x"}]), body
    started = monotonic
    _, _, empty = Server.read(server.request({"/chat" => 1}, headers: {"Dont-Chunk" => "true"}))
    assert_equal "[]", empty
    assert_in_delta 0.5, monotonic - started, 0.3
  end

  def test_http_1_0_is_not_streamed
    server = puma
    @bus.publish("/chat", "a")
    _, headers, body = Server.read(server.request({"/chat" => 0}, version: "HTTP/1.0"))
    assert_equal "application/json; charset=utf-8", headers.to_h["content-type"]
    assert_equal ["a"], ids(JSON.parse(body))
  end

  def test_dlp_and_options_and_404_over_socket
    server = puma
    _, _, body = Server.read(server.request({"/chat" => nil}, path: "/message-bus/c1/poll?dlp=t"))
    assert_equal "[]", body
    status, headers, body = Server.read(server.request("", method: "OPTIONS", type: nil))
    assert_equal [200, "OK"], [status, body]
    assert_equal "must-revalidate, private, max-age=0", headers.to_h["cache-control"]
    status, _, body = Server.read(server.request("", path: "/message-bus/"))
    assert_equal [404, "not found"], [status, body]
  end

  def test_superseded_stream_gets_empty_array_and_terminator
    mw = middleware(long_polling_interval: 5)
    server = puma(mw)
    old = server.request({"/chat" => nil, "__seq" => 1}, type: "application/json")
    parked(mw)
    newer = server.request({"/chat" => nil, "__seq" => 2})
    _, _, body = Server.read(old)
    assert_equal ["[]\r\n|\r\n", "[]\r\n|\r\n"], Server.dechunk(body)
    assert body.end_with?("0\r\n\r\n")
    newer.close
  end

  def test_many_parked_clients_all_receive_one_publish
    mw = middleware(long_polling_interval: 5)
    server = puma(mw)
    mw.reactor
    threads = Thread.list.size
    sockets = Array.new(50) { |i| server.request({"/chat" => nil}, client: "c#{i}", headers: {"Dont-Chunk" => "t"}) }
    parked(mw, 50)
    # Puma's pool may grow to its 4 threads; a thread per parked client would add 50.
    assert_operator Thread.list.size, :<=, threads + 4, "parked clients hold no thread"
    @bus.publish("/chat", "fan-out")
    sockets.each { |s| assert_equal ["fan-out"], ids(JSON.parse(Server.read(s)[2])) }
  end

  def test_extra_headers_on_hijacked_replies_and_streams
    mw = middleware(extra_response_headers_lookup: ->(_env) { {"Access-Control-Allow-Origin" => "https://x.test"} })
    server = puma(mw)
    poll = server.request({"/chat" => nil}, headers: {"Dont-Chunk" => "t"})
    stream = server.request({"/chat" => nil}, client: "c2")
    parked(mw, 2)
    @bus.publish("/chat", "x")
    _, headers, = Server.read(poll)
    assert_equal "https://x.test", headers.to_h["access-control-allow-origin"]
    assert_includes Server.read_until(stream, "\r\n\r\n"), "access-control-allow-origin: https://x.test\r\n"
    stream.close
  end

  def test_429_with_retry_after_over_the_client_limit
    mw = middleware(max_active_clients: 1, retry_after: 20)
    server = puma(mw)
    first = server.request({"/chat" => nil}, client: "first")
    parked(mw)
    status, headers, body = Server.read(server.request({"/chat" => nil}, client: "second"))
    assert_equal 429, status
    assert_equal "20", headers.to_h["retry-after"]
    refute_empty body
    first.close
  end

  private

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
