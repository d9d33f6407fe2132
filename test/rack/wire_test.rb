# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# The reply bytes Wire builds once and shares: per message, per poll reply, per extra-header set.
class WireTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("herald-wire")
    @bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir, fsync: :never))
    @wire = Herald::Rack::Wire.new
  end

  def teardown
    @bus.close
    FileUtils.rm_rf(@dir)
  end

  DATA = ["héllo 🎉", "nul\0byte", "", "x" * 70_000].freeze

  def test_the_same_messages_get_the_same_reply_bytes_until_one_changes
    DATA.each { |d| @bus.publish("/wire", d) }
    first = @wire.json_array(@bus.backlog("/wire", 0).first(3))
    again = @wire.json_array(@bus.backlog("/wire", 0).first(3))
    assert_same first, again, "a second poll for the same messages reuses the reply"
    assert first.frozen?
    assert_equal DATA.first(3), JSON.parse(first).map { |m| m["data"] }
    assert_same @wire.msgpack_array(@bus.backlog("/wire", 0).first(3)), @wire.msgpack_array(@bus.backlog("/wire", 0).first(3))
    # Other positions, other messages, a status: other bytes.
    two = @wire.json_array(@bus.backlog("/wire", 1).first(2))
    assert_equal DATA[1, 2], JSON.parse(two).map { |m| m["data"] }
    with_status = @wire.json_array(@bus.backlog("/wire", 0).first(3), {"/wire" => 4})
    assert_equal 4, JSON.parse(with_status).size
    # A body over the size limit is built every time, and is still right.
    all = @wire.json_array(@bus.backlog("/wire", 0))
    assert_equal DATA, JSON.parse(all).map { |m| m["data"] }
  end

  # A wiped store hands out global id 1 again for another message: the reply must not be the old one.
  def test_a_reset_store_never_gets_the_old_reply
    @bus.publish("/wire", "old")
    assert_equal ["old"], JSON.parse(@wire.json_array(@bus.backlog("/wire", 0))).map { |m| m["data"] }
    @bus.close
    FileUtils.rm_rf(@dir)
    @bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir, fsync: :never))
    @bus.publish("/wire", "new")
    msgs = @bus.backlog("/wire", 0)
    assert_equal 1, msgs.first.global_id
    assert_equal ["new"], JSON.parse(@wire.json_array(msgs)).map { |m| m["data"] }
  end

  # extra_response_headers_lookup (CORS) must not cost every parked client its own encoding.
  def test_a_poll_reply_with_extra_headers_is_built_once_per_header_set
    @bus.publish("/wire", "ünïcode")
    msg = @bus.backlog("/wire", 0).last
    cors = "access-control-allow-origin: https://a.test\r\n"
    reply = @wire.poll_reply(msg, cors)
    assert_same reply, @wire.poll_reply(msg, cors.dup), "an equal header set shares the bytes"
    head, body = reply.split("\r\n\r\n", 2)
    assert_includes head.lines, cors
    assert_equal "ünïcode", JSON.parse(body.force_encoding("UTF-8")).first["data"]
    assert_equal body.bytesize, head[/content-length: (\d+)/, 1].to_i
    other = @wire.poll_reply(msg, "access-control-allow-origin: https://b.test\r\n")
    assert_includes other, "https://b.test"
    refute_includes @wire.poll_reply(msg), "access-control"
    # Past the kept sets a reply is still built right, just not kept.
    20.times { |i| assert_includes @wire.poll_reply(msg, "x-n: #{i}\r\n"), "x-n: #{i}\r\n" }
  end
end
