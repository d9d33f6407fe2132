# frozen_string_literal: true

require_relative "rack_helper"
require "msgpack"

# The event loop's fast path (Reactor#fan_out_one): one message to many parked hijacked long polls, each
# written the message's shared reply for its own extra-header set before any bookkeeping. Targeted messages
# and per-client extra headers (more distinct sets than Wire caches) must never hand one client's bytes to
# another, and the readers that are not plain JSON long polls (streams, MessagePack) still get theirs.
class FanOutTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer
  ORIGINS = 12 # more header sets than Wire::HEADER_SETS keeps
  POLLS = 36
  DATA = "héllo 🎉 \u0000 \"quoted\" \\ end"

  def setup
    super
    @mw = middleware(long_polling_interval: 10,
      user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i },
      extra_response_headers_lookup: ->(env) { {"Access-Control-Allow-Origin" => env["HTTP_X_ORIGIN"]} })
    @server = puma(@mw)
  end

  def test_targeted_message_and_header_sets_never_cross
    polls = Array.new(POLLS) { |i| [i, park(i)] }
    stream = @server.request({"/chat" => nil}, client: "stream", headers: {"X-User" => "1", "X-Origin" => "https://stream.test"})
    packed = park(POLLS, user: 1, accept: Herald::Rack::Middleware::MSGPACK_TYPE)
    parked(@mw, POLLS + 2)

    @bus.publish("/chat", DATA, user_ids: [1]) # users are i % 3: a third of the polls, the stream, the packed poll
    polls.each do |i, socket|
      next unless i % 3 == 1
      status, headers, body = Server.read(socket)
      assert_equal 200, status
      assert_equal [origin(i)], headers.filter_map { |k, v| v if k == "access-control-allow-origin" }, "client #{i}"
      assert_equal [DATA], ids(JSON.parse(body.force_encoding(Encoding::UTF_8))), "client #{i}"
    end
    assert_equal [DATA], MessagePack.unpack(Server.read(packed)[2]).map { |m| m["data"] }
    assert_includes Server.read_until(stream, "\\u0000").b, "access-control-allow-origin: https://stream.test\r\n"
    parked(@mw, POLLS - POLLS / 3 + 1)

    @bus.publish("/chat", "for everyone")
    polls.each do |i, socket|
      next if i % 3 == 1
      _, headers, body = Server.read(socket)
      assert_equal [origin(i)], headers.filter_map { |k, v| v if k == "access-control-allow-origin" }, "client #{i}"
      assert_equal ["for everyone"], ids(JSON.parse(body)), "client #{i}: the targeted message must not reach it"
    end
    assert_includes Server.read_until(stream, "for everyone"), "for everyone"
    parked(@mw, 1)
  ensure
    stream&.close
  end

  # Answered polls are unindexed after the writes: the next message finds none of them, and a client that
  # polls again at once (the JS client's next poll) is parked under the same id and gets the next message.
  def test_answered_polls_are_forgotten_and_can_park_again
    sockets = Array.new(20) { |i| park(i) }
    parked(@mw, 20)
    @bus.publish("/chat", "one")
    sockets.each { |s| assert_equal ["one"], ids(JSON.parse(Server.read(s)[2])) }
    parked(@mw, 0)
    again = Array.new(20) { |i| park(i, from: @bus.last_id("/chat")) }
    parked(@mw, 20)
    @bus.publish("/chat", "two")
    again.each { |s| assert_equal ["two"], ids(JSON.parse(Server.read(s)[2])) }
    parked(@mw, 0)
  end

  # A fan-out that answers every reader of its channel drops that channel's entry of the index at once; the
  # readers parked under other channels as well must leave those entries too, or the next message there would
  # find closed connections (and the index would keep them). Readers of one channel alone, and readers of both,
  # and a poll on the other channel only that stays parked through the fan-out.
  def test_answering_every_reader_of_a_channel_unindexes_them_from_their_other_channels
    both = Array.new(6) { |i| @server.request({"/chat" => nil, "/other" => nil}, client: "both#{i}", headers: {"Dont-Chunk" => "t"}) }
    alone = Array.new(4) { |i| park(i) }
    other = @server.request({"/other" => nil}, client: "other", headers: {"Dont-Chunk" => "t"})
    parked(@mw, 11)
    @bus.publish("/chat", DATA)
    (both + alone).each { |s| assert_equal [DATA], ids(JSON.parse(Server.read(s)[2].force_encoding(Encoding::UTF_8))) }
    parked(@mw, 1)
    index = @mw.reactor.instance_variable_get(:@index)
    assert_equal ["/other"], index.keys
    assert_equal ["other"], index["/other"].keys.map { |conn| conn.client.id }
    @bus.publish("/other", "after")
    assert_equal ["after"], ids(JSON.parse(Server.read(other)[2]))
    parked(@mw, 0)
    assert_empty index
  end

  # A reply larger than the socket takes at once: the fast path leaves the rest pending, unindexes the
  # client, and the event loop writes the rest as the reader drains it, then closes.
  def test_a_reply_larger_than_the_socket_buffer
    big = "🎉#{"x" * 3_000_000}"
    sockets = Array.new(3) { |i| @server.request({"/chat" => nil}, client: "big#{i}", headers: {"Dont-Chunk" => "t"}, rcvbuf: 4096) }
    parked(@mw, 3)
    @bus.publish("/chat", big)
    parked(@mw, 0) # unindexed at once, though most of each reply is still to go
    sockets.each { |s| assert_equal [big], ids(JSON.parse(Server.read(s, timeout: 20)[2].force_encoding(Encoding::UTF_8))) }
  end

  private

  def origin(i) = "https://o#{i % ORIGINS}.test"

  def park(i, user: i % 3, accept: nil, from: nil)
    headers = {"Dont-Chunk" => "t", "X-User" => user.to_s, "X-Origin" => origin(i)}
    headers["Accept"] = accept if accept
    @server.request({"/chat" => from}, client: "c#{i}", headers: headers)
  end
end
