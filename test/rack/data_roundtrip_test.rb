# frozen_string_literal: true

require_relative "rack_helper"
require_relative "../support/real_data"
require "msgpack"

# Every byte comes back over HTTP: the data users send, in channel names and site ids too, through a
# long poll, a chunked stream, SSE and MessagePack replies, from the embedded log (the default store).
class RackDataRoundtripTest < Minitest::Test
  include Herald::RackHelpers

  MSGPACK = "application/vnd.msgpack"
  TEXTS = RealData::TEXTS
  CHANNELS = RealData::CHANNELS

  def setup
    super
    @dir = Dir.mktmpdir("herald-http-rt")
    @bus.close
    @bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir, fsync: :never))
  end

  def teardown
    super
    FileUtils.rm_rf(@dir)
  end

  def expected = TEXTS.map { |t| {"text" => t, "ü" => [t]} }

  def publish_all(channel, bus: @bus, site_id: nil, data: expected)
    data.each { |d| bus.publish(channel, d, site_id: site_id) }
  end

  def test_long_poll_json_in_every_channel_name
    CHANNELS.each { |c| publish_all(c, data: expected.first(3)) }
    body = JSON.parse(poll(mock, CHANNELS.to_h { |c| [c, 0] }, query: "dlp=t").body)
    CHANNELS.each do |c|
      assert_equal expected.first(3), body.select { |m| m["channel"] == c }.map { |m| m["data"] }, c.inspect
    end
  end

  def test_form_encoded_poll_names_a_unicode_channel
    publish_all("/chat/héllo 👋")
    body = JSON.parse(poll(mock, "#{URI.encode_www_form_component("/chat/héllo 👋")}=0", query: "dlp=t").body)
    assert_equal expected, body.map { |m| m["data"] }
  end

  def test_chunked_stream_over_a_socket
    mw = middleware(long_polling_interval: 30) # the stream stays open until the test has read it all
    server = puma(mw)
    publish_all("/chat/ü", data: expected.first(4))
    socket = server.request({"/chat/ü" => 0})
    parked(mw)
    publish_all("/chat/ü", data: expected.drop(4) + ["the end"])
    raw = Herald::PumaServer.read_until(socket, %("data":"the end"}]\r\n|\r\n\r\n), timeout: 20) # up to its chunk's end
    socket.close
    chunks = Herald::PumaServer.dechunk(raw.split("\r\n\r\n", 2).last + "\r\n0\r\n\r\n")
    got = segments(chunks.join.force_encoding(Encoding::UTF_8)).flatten.reject { |m| m["data"] == "the end" }
    assert_equal expected, got.map { |m| m["data"] }
  end

  def test_sse
    publish_all("/sse/日本")
    body = mock.get("/message-bus/c1/sse?#{URI.encode_www_form("/sse/日本" => 0)}").body
    events = body.force_encoding(Encoding::UTF_8).split("\n\n").filter_map { |b| b[/^data: (.*)$/, 1] }
    assert_equal expected, events.map { |e| JSON.parse(e)["data"] }
  end

  def test_msgpack_reply_from_a_json_bus
    publish_all("/mp/é")
    reply = MessagePack.unpack(poll(mock, {"/mp/é" => 0}, query: "dlp=t", HTTP_ACCEPT: MSGPACK).body)
    assert_equal expected, reply.map { |m| m["data"] }
    assert_equal ["/mp/é"], reply.map { |m| m["channel"] }.uniq
  end

  def test_binary_through_a_msgpack_bus_and_its_msgpack_reply
    bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: File.join(@dir, "mp"), fsync: :never), codec: :msgpack)
    mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 0.5).tap { |m| @middlewares << m }
    blobs = RealData::BINARY.first(3) + [{"b" => RealData::BINARY.first, "t" => "é👋"}]
    publish_all("/bin", bus: bus, data: blobs)
    reply = MessagePack.unpack(poll(mock(mw), {"/bin" => 0}, query: "dlp=t", HTTP_ACCEPT: MSGPACK).body)
    assert_equal blobs, reply.map { |m| m["data"] }
    assert_equal Encoding::BINARY, reply.first["data"].encoding
  ensure
    bus&.close
  end

  # A JSON client cannot be sent binary: the message comes with data null (and a warning), never a 500.
  def test_binary_message_to_a_json_client_is_null_not_a_500
    bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: :msgpack)
    mw = Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 0.5).tap { |m| @middlewares << m }
    bus.publish("/bin", "\xFF".b)
    bus.publish("/bin", "ok é")
    response = nil
    assert_output(nil, /JSON/) { response = poll(mock(mw), {"/bin" => 0}, query: "dlp=t") }
    assert_equal 200, response.status
    assert_equal [nil, "ok é"], JSON.parse(response.body).map { |m| m["data"] }
  ensure
    bus&.close
  end

  def test_site_ids_keep_sites_apart
    RealData::SITES.compact.each { |s| @bus.publish("/s", "for #{s.inspect}", site_id: s) }
    @bus.publish("/s", "for no site")
    RealData::SITES.each do |site|
      mw = middleware(site_id_lookup: ->(_env) { site })
      body = JSON.parse(poll(mock(mw), {"/s" => 0}, query: "dlp=t").body)
      assert_equal [site ? "for #{site.inspect}" : "for no site"], body.map { |m| m["data"] }, "site #{site.inspect}"
    end
  end
end
