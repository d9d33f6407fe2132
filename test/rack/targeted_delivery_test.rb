# frozen_string_literal: true

require_relative "rack_helper"
require "msgpack"

# Targeted messages (user_ids OR group_ids, AND client_ids; site_id; /global/) reach exactly their readers on
# every path: backlog replies (JSON, MessagePack, first chunk, SSE) and live delivery (long poll, chunked,
# SSE, MessagePack stream), over hijacked sockets and through Rack bodies. The tokens are unique strings;
# a reader's bytes must hold its expected ones and none of the others.
class TargetedDeliveryTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer

  READERS = {
    "u1" => {"X-User" => "1", "X-Groups" => "7"},
    "u2" => {"X-User" => "2"},
    "anon" => {},
    "cx" => {},
    "s2" => {"X-Site" => "s2"}
  }.freeze
  EXPECTED = {
    "u1" => %w[FOR-U1 FOR-G7 GLOBAL END0],
    "u2" => %w[GLOBAL END0],
    "anon" => %w[GLOBAL END0],
    "cx" => %w[FOR-CX GLOBAL END0],
    "s2" => %w[SITE-S2 GLOBAL ENDS2]
  }.freeze
  ALL = EXPECTED.values.flatten.uniq + %w[FOR-U2-AND-CX]

  def setup
    super
    @mw = middleware(long_polling_interval: 3,
      user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i },
      group_ids_lookup: ->(env) { env["HTTP_X_GROUPS"]&.split(",")&.map(&:to_i) },
      site_id_lookup: ->(env) { env["HTTP_X_SITE"] })
  end

  def publish_all
    @bus.publish("/chat", "FOR-U1", user_ids: [1])
    @bus.publish("/chat", "FOR-G7", group_ids: [7])
    @bus.publish("/chat", "FOR-CX", client_ids: ["cx"])
    @bus.publish("/chat", "FOR-U2-AND-CX", user_ids: [2], client_ids: ["cx"])
    @bus.publish("/chat", "SITE-S2", site_id: "s2")
    @bus.publish("/global/news", "GLOBAL", site_id: "s2")
    @bus.publish("/chat", "END0")
    @bus.publish("/chat", "ENDS2", site_id: "s2")
  end

  def assert_exact(received, path)
    READERS.each_key do |reader|
      got = ALL.select { |token| received.fetch(reader).include?(token) }
      assert_equal EXPECTED[reader].sort, got.sort, "#{reader} on #{path}"
    end
  end

  def end_token(reader) = (reader == "s2") ? "ENDS2" : "END0"

  CHANNELS = {"/chat" => 0, "/global/news" => 0}.freeze

  def test_backlog_replies_json_msgpack_first_chunk_and_sse
    publish_all
    server = puma(@mw)
    variants = {
      "backlog JSON" => ->(r, h) { Server.read(server.request(CHANNELS, client: r, path: "/message-bus/#{r}/poll?dlp=t", headers: h))[2] },
      "backlog MessagePack" => ->(r, h) { Server.read(server.request(CHANNELS, client: r, path: "/message-bus/#{r}/poll?dlp=t", headers: h.merge("Accept" => "application/vnd.msgpack")))[2] },
      "first chunk" => ->(r, h) { read_stream(server.request(CHANNELS, client: r, headers: h), r) },
      "SSE backlog" => ->(r, h) { read_stream(server.request("", method: "GET", type: nil, path: "/message-bus/#{r}/sse?%2Fchat=0&%2Fglobal%2Fnews=0", headers: h), r) },
      "SSE Last-Event-ID" => ->(r, h) { read_stream(server.request("", method: "GET", type: nil, path: "/message-bus/#{r}/sse?%2Fchat=&%2Fglobal%2Fnews=", headers: h.merge("Last-Event-ID" => "0")), r) }
    }
    variants.each do |path, fetch|
      assert_exact(READERS.to_h { |reader, headers| [reader, fetch.call(reader, headers)] }, path)
    end
  end

  def test_live_streams_over_sockets
    server = puma(@mw)
    {
      "chunked" => ->(r, h) { server.request(CHANNELS.transform_values { nil }, client: r, headers: h) },
      "MessagePack stream" => ->(r, h) { server.request(CHANNELS.transform_values { nil }, client: r, headers: h.merge("Accept" => "application/vnd.msgpack")) },
      "SSE" => ->(r, h) { server.request("", method: "GET", type: nil, path: "/message-bus/#{r}/sse?%2Fchat=&%2Fglobal%2Fnews=", headers: h) }
    }.each do |path, open|
      sockets = READERS.to_h { |reader, headers| [reader, open.call(reader, headers)] }
      parked(@mw, READERS.size)
      publish_all
      assert_exact(sockets.to_h { |reader, socket| [reader, read_stream(socket, reader)] }, "live #{path}")
      parked(@mw, 0)
    end
  end

  def test_live_long_polls_over_sockets_and_through_rack_bodies
    server = puma(@mw)
    m = mock(@mw)
    socket_poll = ->(r, h, body) { Server.read(server.request(body, client: r, headers: h.merge("Dont-Chunk" => "t")))[2] }
    rack_poll = ->(r, h, body) { poll(m, body, client: r, HTTP_DONT_CHUNK: "t", **h.to_h { |k, v| ["HTTP_#{k.upcase.tr("-", "_")}", v] }).body }
    {"socket long poll" => socket_poll, "Rack body long poll" => rack_poll}.each do |path, fetch|
      start = @bus.last_ids("/chat", "/global/news")
      start_s2 = @bus.last_ids("/chat", "/global/news", site_id: "s2")
      threads = READERS.to_h do |reader, headers|
        positions = (reader == "s2") ? start_s2 : start
        [reader, in_thread { collect_polls(reader, positions) { |body| fetch.call(reader, headers, body) } }]
      end
      parked(@mw, READERS.size)
      publish_all
      assert_exact(threads.transform_values(&:value), path)
    end
  end

  def test_rack_body_stream_and_sse
    @mw = middleware(long_polling_interval: 1, **@mw.options.slice(:user_id_lookup, :group_ids_lookup, :site_id_lookup))
    m = mock(@mw)
    headers = ->(h) { h.to_h { |k, v| ["HTTP_#{k.upcase.tr("-", "_")}", v] } }
    {
      "Rack body chunked" => ->(r, h) { poll(m, CHANNELS.transform_values { nil }, client: r, **headers.call(h)).body },
      "Rack body SSE" => ->(r, h) { m.get("/message-bus/#{r}/sse?%2Fchat=&%2Fglobal%2Fnews=", headers.call(h)).body }
    }.each do |path, fetch|
      threads = READERS.to_h { |reader, h| [reader, in_thread { fetch.call(reader, h) }] }
      parked(@mw, READERS.size)
      publish_all
      assert_exact(threads.transform_values(&:value), path)
    end
  end

  private

  # Reads a stream until the reader's end token, then hangs up.
  def read_stream(socket, reader)
    Server.read_until(socket, end_token(reader))
  ensure
    socket.close
  end

  # Long polls again and again (as the JS client does) until the end token arrives.
  def collect_polls(reader, positions)
    positions = positions.dup
    seen = +""
    10.times do
      body = yield positions.dup
      seen << body
      JSON.parse(body).each do |m|
        if m["channel"] == "/__status"
          positions.merge!(m["data"])
        else
          positions[m["channel"]] = m["message_id"]
        end
      end
      break if seen.include?(end_token(reader))
    end
    seen
  end
end
