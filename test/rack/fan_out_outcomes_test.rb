# frozen_string_literal: true

require_relative "rack_helper"

# Reactor#fan_out_one on connections whose sockets take the whole reply, part of it, or fail the write. A whole
# reply leaves its connection closed with no on_close callback (SocketConnection#write_reply returns true): the
# loop itself must then close that socket after the writes, and only those. A partial one keeps its socket open
# until the rest is out; a failed one is dropped; none of them stays parked or indexed.
class FanOutOutcomesTest < Minitest::Test
  # A socket stand-in on a pipe's read end (so nio4r can register it) that records the bytes it takes.
  class Peer < IO
    attr_accessor :mode
    attr_reader :taken

    # :partial takes the first half, then nothing more (its buffer stays full).
    def write_nonblock(bytes, exception: true)
      case mode
      when :whole then take(bytes)
      when :partial then @taken ? :wait_writable : take(bytes.byteslice(0, bytes.bytesize / 2))
      when :fail then raise Errno::EPIPE
      end
    end

    def read_nonblock(*, exception: true) = :wait_readable

    private

    def take(bytes)
      @taken = (@taken || "".b) + bytes.b
      bytes.bytesize
    end
  end

  MODES = %i[whole partial fail].freeze
  DATA = "héllo 🎉 \u0000 end"

  def setup
    @bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    @errors = Queue.new
    @reactor = Herald::Rack::Reactor.new(bus: @bus, wire: Herald::Rack::Wire.new, filters: [], write_timeout: 30,
      on_error: ->(e) { @errors << e })
    @pipes = []
  end

  def teardown
    @reactor.close
    @bus.close
    @pipes.each { |pair| pair.each { |io| io.close unless io.closed? } }
  end

  def test_whole_partial_and_failed_replies = outcomes

  # The finished sockets wait for the close delay, then close with the failed ones.
  def test_whole_partial_and_failed_replies_with_a_close_delay
    @reactor.close_delay = 0.05
    outcomes
  end

  private

  def outcomes
    seed = Integer(ENV.fetch("SEED", Random.new_seed % 100_000))
    modes = Array.new(60) { |i| MODES[i % 3] }.shuffle(random: Random.new(seed))
    conns = modes.each_with_index.map { |mode, i| park(mode, i) }
    eventually(message: "all parked (SEED=#{seed})") { @reactor.size == conns.size }

    id = @bus.publish("/fan", DATA)
    eventually(message: "none parked (SEED=#{seed})") { @reactor.size.zero? }
    eventually(message: "closed (SEED=#{seed})") { conns.each_with_index.all? { |c, i| c.closed? == (modes[i] != :partial) } }

    reply = Herald::Rack::Wire.new.poll_reply(@bus.backlog("/fan", id - 1).first, "")
    conns.each_with_index do |conn, i|
      peer = conn.io
      case modes[i]
      when :whole
        assert_equal reply.b, peer.taken, "whole reply #{i} (SEED=#{seed})"
        eventually(message: "socket #{i} closed by the loop (SEED=#{seed})") { peer.closed? }
      when :partial
        assert_equal reply.b.byteslice(0, reply.bytesize / 2), peer.taken, "first half #{i} (SEED=#{seed})"
        refute peer.closed?, "socket #{i} waits for the rest (SEED=#{seed})"
        assert conn.pending?
      when :fail
        eventually(message: "socket #{i} closed after its failed write (SEED=#{seed})") { peer.closed? }
      end
    end
    assert_empty @reactor.instance_variable_get(:@index), "SEED=#{seed}"
    assert_empty @errors.size.times.map { @errors.pop }.reject { |e| e.is_a?(Errno::EPIPE) }
  end

  def park(mode, i)
    read, write = IO.pipe
    @pipes << [read, write]
    read.autoclose = false
    peer = Peer.for_fd(read.fileno)
    peer.mode = mode
    client = Herald::Rack::Client.new(id: "c#{i}", user_id: nil, group_ids: nil, site_id: nil, seq: 0,
      positions: {"/fan" => @bus.last_id("/fan")})
    conn = Herald::Rack::SocketConnection.new(io: peer, extra_headers: "", max_buffer: 1 << 20, client: client,
      mode: :poll, encoding: :json, wire: @reactor.instance_variable_get(:@wire))
    conn.deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    @reactor.park(conn, [], nil, @bus.store.last_global_id)
    conn
  end

  def eventually(message:, timeout: 5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until yield
      flunk message if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.01
    end
  end
end
