# frozen_string_literal: true

require_relative "rack_helper"
require "msgpack"

# The event loop's fast path for a batch of several messages (Reactor#fan_out): messages published back to
# back reach the loop together; each hijacked JSON long poll gets one reply with every message of the batch
# it may see, in order, shared only with readers that take the very same messages with the same extra
# headers. Targeted messages, client message filters, several channels per client, MessagePack polls and
# streams in the same batch.
class FanOutBatchTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer
  POLLS = 24
  ORIGINS = 4
  CHANNELS = [["/a"], ["/b"], ["/a", "/b"]].freeze
  # [channel, data, targets]: published in one go, so the loop sees them as one batch (or a few).
  BATCH = [
    ["/a", "héllo 🎉 \u0000 a1", {}],
    ["/b", "b1 hidden", {}], # the /b filter keeps it from everyone
    ["/a", "for user 1 ✓", {user_ids: [1]}],
    ["/b", "b2 \u0000 \"quoted\" 日本", {}],
    ["/a", "only c4 and c5", {client_ids: %w[c4 c5]}],
    ["/b", "", {}]
  ].freeze

  # Counts the fan-outs (Reactor#trace): fewer than messages means some went out as one batch.
  class Batches
    attr_reader :starts

    def initialize = @starts = 0

    def start(_msg)
      @starts += 1
      nil
    end
  end

  def setup
    super
    @mw = middleware(long_polling_interval: 10,
      user_id_lookup: ->(env) { env["HTTP_X_USER"]&.to_i },
      extra_response_headers_lookup: ->(env) { {"Access-Control-Allow-Origin" => env["HTTP_X_ORIGIN"]} },
      client_message_filters: [["/b", ->(msg) { !msg.data.include?("hidden") }]])
    @server = puma(@mw)
  end

  def teardown
    Herald::Instrumentation.unsubscribe(@subscriber) if @subscriber
    super
  end

  def test_a_batch_reaches_every_reader_with_what_it_may_see
    assert batched_round, "the messages never reached the event loop as one batch"
  end

  # deliver.herald counts each long poll's messages, however many the batch carried.
  def test_deliver_events_count_each_polls_messages
    events = Queue.new
    @subscriber = Herald::Instrumentation.subscribe("deliver.herald") { |_name, payload, _| events << payload }
    assert batched_round { events.clear }, "the messages never reached the event loop as one batch"
    polls = []
    polls << events.pop until events.empty?
    counts = polls.select { |p| p[:mode] == :long_poll && p[:encoding] == :json }.map { |p| p[:messages] }
    assert_equal Array.new(POLLS) { |i| expected(i).size }.sort, counts.sort
  end

  private

  # Tried a few times: each try checks every reply; the batching itself is up to the threads. True once
  # a try went out as fewer fan-outs than messages (the block runs before each try).
  def batched_round
    5.times.any? do |round|
      yield if block_given?
      batches = Batches.new
      @mw.reactor.trace = batches
      one_round(round)
      batches.starts < BATCH.size
    end
  end

  def one_round(round)
    from = %w[/a /b].to_h { |c| [c, @bus.last_id(c)] }
    polls = Array.new(POLLS) { |i| [i, park(i, from)] }
    packed = park(POLLS, from, accept: Herald::Rack::Middleware::MSGPACK_TYPE)
    stream = @server.request(from, client: "stream#{round}", headers: {"X-User" => "1", "X-Origin" => "https://s.test"})
    parked(@mw, POLLS + 2)

    ids = BATCH.map { |channel, data, targets| @bus.publish(channel, data, **targets) }
    polls.each do |i, socket|
      status, headers, body = Server.read(socket)
      assert_equal 200, status
      assert_equal [origin(i)], headers.filter_map { |k, v| v if k == "access-control-allow-origin" }, "client #{i}"
      messages = JSON.parse(body.force_encoding(Encoding::UTF_8))
      assert_equal expected(i), messages.map { |m| m["data"] }, "client #{i}"
      assert_equal messages.map { |m| m["message_id"] }, messages.map { |m| ids[BATCH.index { |_, d, _| d == m["data"] }] }
    end
    assert_equal expected(POLLS), MessagePack.unpack(Server.read(packed)[2]).map { |m| m["data"] }
    seen = Server.read_until(stream, "日本".b).force_encoding(Encoding::UTF_8)
    assert_includes seen, "for user 1 ✓"
    refute_includes seen, "hidden"
    parked(@mw, 1) # the stream
  ensure
    stream&.close
    parked(@mw, 0)
  end

  # What client i may see of BATCH, in order: its channels, its user (i % 2), its id, the /b filter.
  def expected(i)
    channels = CHANNELS[i % 3]
    BATCH.filter_map do |channel, data, targets|
      next unless channels.include?(channel)
      next if targets[:user_ids] && !targets[:user_ids].include?(i % 2)
      next if targets[:client_ids] && !targets[:client_ids].include?("c#{i}")
      next if data.include?("hidden")
      data
    end
  end

  def origin(i) = "https://o#{i % ORIGINS}.test"

  def park(i, from, accept: nil)
    headers = {"Dont-Chunk" => "t", "X-User" => (i % 2).to_s, "X-Origin" => origin(i)}
    headers["Accept"] = accept if accept
    @server.request(from.slice(*CHANNELS[i % 3]), client: "c#{i}", headers: headers)
  end
end
