# frozen_string_literal: true

require_relative "rack_helper"
require "msgpack"

# Beyond message_bus: Server-Sent Events with Last-Event-ID resume, and MessagePack replies and streams.
class SseAndMsgpackTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer
  MSGPACK = "application/vnd.msgpack"

  def sse_events(text)
    text.split("\n\n").filter_map do |block|
      fields = block.lines.map(&:chomp).reject { |l| l.start_with?(":") }.to_h { |l| l.split(": ", 2) }
      fields unless fields.empty? || fields.keys == ["retry"]
    end
  end

  def test_sse_headers_backlog_live_and_end_over_a_socket
    mw = middleware
    server = puma(mw)
    @bus.publish("/chat", "old")
    socket = server.request("", method: "GET", type: nil, path: "/message-bus/c1/sse?%2Fchat=0")
    head = Server.read_until(socket, "old")
    assert_includes head, "content-type: text/event-stream\r\n"
    assert_includes head, "cache-control: must-revalidate, private, max-age=0\r\n"
    parked(mw)
    @bus.publish("/chat", {"n" => 1})
    rest = Server.read_raw(socket) # the stream ends after long_polling_interval; EventSource reconnects
    events = sse_events((head + rest).split("\r\n\r\n", 2).last)
    assert_equal [["1", {"global_id" => 1, "message_id" => 1, "channel" => "/chat", "data" => "old"}],
      ["2", {"global_id" => 2, "message_id" => 2, "channel" => "/chat", "data" => {"n" => 1}}]],
      events.map { |e| [e["id"], JSON.parse(e["data"])] }
  end

  def test_sse_resumes_after_last_event_id_across_channels_in_global_order
    @bus.publish("/a", "a1")
    @bus.publish("/b", "b1")
    @bus.publish("/a", "a2")
    @bus.publish("/c", "c1")
    @bus.publish("/b", "b2")
    body = mock.get("/message-bus/c1/sse?%2Fa=&%2Fb=", "HTTP_LAST_EVENT_ID" => "1").body
    events = sse_events(body)
    assert_equal %w[2 3 5], events.map { |e| e["id"] }
    assert_equal %w[b1 a2 b2], events.map { |e| JSON.parse(e["data"])["data"] }
  end

  def test_sse_status_event_for_minus_one
    @bus.publish("/a", "a1")
    events = sse_events(mock.get("/message-bus/c1/sse?%2Fa=-1").body)
    assert_equal [{"event" => "status", "data" => %({"global_id":-1,"message_id":-1,"channel":"/__status","data":{"/a":1}})}], events
  end

  # SSE is text: an EventSource asking for MessagePack still gets text/event-stream with JSON data lines,
  # on a JSON bus and on a MessagePack bus, over a hijacked socket and as a Rack body.
  def test_sse_is_text_event_stream_with_json_data_whatever_accept_says
    [:json, :msgpack].each do |codec|
      bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: codec)
      mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 0.3)
      @middlewares << mw
      bus.publish("/chat", {"text" => "héllo 🎉"})
      socket = puma(mw).request("", method: "GET", type: nil, path: "/message-bus/c1/sse?%2Fchat=0", headers: {"Accept" => MSGPACK})
      _, headers, body = Server.read(socket)
      response = mock(mw).get("/message-bus/c2/sse?%2Fchat=0", "HTTP_ACCEPT" => MSGPACK)
      [[headers.to_h["content-type"], body], [response.headers["content-type"], response.body]].each do |type, text|
        assert_equal "text/event-stream", type, codec
        assert_equal [{"text" => "héllo 🎉"}], sse_events(text.force_encoding("UTF-8")).map { |e| JSON.parse(e["data"])["data"] }, codec
      end
    ensure
      bus&.close
    end
  end

  # A MessagePack bus carries what JSON cannot (binary strings, NaN). A JSON client still gets the message,
  # with data null (and a warning), in a reply, a stream, SSE and when parked; a MessagePack client gets
  # every byte unchanged.
  def test_binary_and_nan_from_a_msgpack_bus_reach_json_clients_as_null
    bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: :msgpack)
    mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 0.3)
    @middlewares << mw
    bus.publish("/chat", {"bin" => "\xFF\x00ok".b})
    bus.publish("/chat", {"nan" => Float::NAN})
    bus.publish("/chat", "é")
    capture_io do
      reply = poll(mock(mw), {"/chat" => 0}, query: "dlp=t")
      assert_equal [nil, nil, "é"], ids(JSON.parse(reply.body))
      stream = poll(mock(mw), {"/chat" => 0}, client: "c2")
      assert_equal [[nil, nil, "é"], []], segments(stream.body).map { |s| ids(s) }
      sse = mock(mw).get("/message-bus/c3/sse?%2Fchat=0")
      assert_equal [nil, nil, "é"], sse_events(sse.body.force_encoding("UTF-8")).map { |e| JSON.parse(e["data"])["data"] }
    end
    packed = MessagePack.unpack(poll(mock(mw), {"/chat" => 0}, query: "dlp=t", HTTP_ACCEPT: MSGPACK).body)
    assert_equal "\xFF\x00ok".b, packed.first["data"]["bin"]
    assert_equal Encoding::BINARY, packed.first["data"]["bin"].encoding
  ensure
    bus&.close
  end

  # Published while the client is parked: the event loop builds the JSON bytes, and the client gets them.
  def test_binary_from_a_msgpack_bus_reaches_a_parked_json_client
    bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: :msgpack)
    mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 2)
    @middlewares << mw
    waiting = in_thread { poll(mock(mw), {"/chat" => nil}, HTTP_DONT_CHUNK: "t") }
    parked(mw)
    capture_io do
      bus.publish("/chat", "\xFFbytes".b)
      assert_equal [nil], ids(JSON.parse(waiting.value.body))
    end
  ensure
    bus&.close
  end

  def test_msgpack_reply_has_the_same_shape
    @bus.publish("/chat", {"x" => [1, 2]})
    response = poll(mock, {"/chat" => 0, "/other" => -1}, query: "dlp=t", HTTP_ACCEPT: MSGPACK)
    assert_equal MSGPACK, response.headers["content-type"]
    assert_equal [{"global_id" => 1, "message_id" => 1, "channel" => "/chat", "data" => {"x" => [1, 2]}},
      {"global_id" => -1, "message_id" => -1, "channel" => "/__status", "data" => {"/other" => 0}}], MessagePack.unpack(response.body)
  end

  def test_msgpack_stream_over_a_socket_with_a_msgpack_bus
    bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: :msgpack)
    mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 0.5)
    @middlewares << mw
    server = puma(mw)
    bus.publish("/chat", {"bin" => "é"})
    socket = server.request({"/chat" => 0}, headers: {"Accept" => MSGPACK})
    parked(mw)
    bus.publish("/chat", [1, nil, true])
    _, headers, body = Server.read(socket)
    assert_equal MSGPACK, headers.to_h["content-type"]
    unpacker = MessagePack::Unpacker.new
    Server.dechunk(body).each { |chunk| unpacker.feed(chunk) }
    arrays = unpacker.each.to_a
    assert_equal [[{"bin" => "é"}], [[1, nil, true]], []], arrays.map { |a| a.map { |m| m["data"] } }
  ensure
    bus&.close
  end

  # The store's epoch rides on every MessagePack reply (only Herald's client asks for MessagePack), immediate,
  # held and streamed, so that a reset store is noticed even when its new ids are above the client's; JSON
  # replies, what message_bus's clients get, stay as message_bus sends them.
  def test_msgpack_replies_name_the_store_epoch_and_json_replies_do_not
    epoch = @bus.store.epoch
    assert_match(/\A\h{16}\z/, epoch)
    response = poll(mock, {"/chat" => 0}, query: "dlp=t", HTTP_ACCEPT: MSGPACK)
    assert_equal epoch, response.headers["herald-epoch"]
    response = poll(mock, {"/chat" => 0}, query: "dlp=t")
    assert_nil response.headers["herald-epoch"]

    mw = middleware
    server = puma(mw)
    socket = server.request({"/chat" => 0}, headers: {"Accept" => MSGPACK})
    parked(mw)
    @bus.publish("/chat", "streamed")
    assert_equal epoch, Server.read(socket)[1].to_h["herald-epoch"]
    socket = server.request({"/chat" => 1}, headers: {"Accept" => MSGPACK, "Dont-Chunk" => "true"})
    parked(mw)
    @bus.publish("/chat", "held")
    _, headers, body = Server.read(socket)
    assert_equal epoch, headers.to_h["herald-epoch"]
    assert_equal ["held"], MessagePack.unpack(body).map { |m| m["data"] }
    socket = server.request({"/chat" => 2}, headers: {"Dont-Chunk" => "true"})
    parked(mw)
    @bus.publish("/chat", "json")
    refute_includes Server.read(socket)[1].to_h.keys, "herald-epoch"

    cors = mock(middleware(extra_response_headers_lookup: ->(_env) { {"Access-Control-Allow-Origin" => "https://app.test"} }))
    response = poll(cors, {"/chat" => 0}, query: "dlp=t", HTTP_ACCEPT: MSGPACK)
    assert_equal ["https://app.test", epoch, "herald-epoch"],
      response.headers.values_at("access-control-allow-origin", "herald-epoch", "access-control-expose-headers")
    assert_nil poll(cors, {"/chat" => 0}, query: "dlp=t").headers["access-control-expose-headers"]

    other = Herald::Bus.new(store: Herald::Store::Memory.new)
    refute_equal epoch, other.store.epoch, "each Memory store is its own epoch"
  ensure
    other&.close
  end

  # Bytes are built once per message and shared: the same frozen String for every reader.
  def test_wire_bytes_are_built_once_per_message
    wire = Herald::Rack::Wire.new
    msg = @bus.publish_message("/chat", "x")
    again = @bus.backlog("/chat", 0).first
    assert_same wire.chunk(msg), wire.chunk(again)
    assert_same wire.sse(msg), wire.sse(msg)
    assert_same wire.msgpack(msg), wire.msgpack(again)
    assert wire.chunk(msg).frozen?
  end

  # The cache is bounded by bytes as well as by count: large messages do not stay pinned by the thousand.
  def test_wire_cache_is_bounded_by_bytes
    wire = Herald::Rack::Wire.new
    50.times { |i| wire.chunk(@bus.publish_message("/big", "#{i}é" + "x" * 1024 * 1024)) }
    cached = %i[@young @old].sum { |name| wire.instance_variable_get(name).size }
    assert_operator cached, :<=, 8, "1 MiB messages cached (default bound: about 32 MiB of wire bytes)"
    small = Herald::Rack::Wire.new
    500.times { |i| small.chunk(@bus.publish_message("/small", "m#{i}")) }
    assert_equal 500, %i[@young @old].sum { |name| small.instance_variable_get(name).size }, "small messages all stay"
  end

  # A reset store hands out the same global ids again: cached bytes must never be sent for another message.
  def test_wire_cache_survives_a_store_reset
    wire = Herald::Rack::Wire.new
    first = @bus.publish_message("/chat", "before the reset")
    assert_includes wire.json(first), "before the reset"
    other = Herald::Bus.new(store: Herald::Store::Memory.new)
    again = other.publish_message("/chat", "after the reset")
    assert_equal first.global_id, again.global_id
    assert_includes wire.json(again), "after the reset"
    assert_includes wire.poll_reply(again), "after the reset"
  ensure
    other&.close
  end
end
