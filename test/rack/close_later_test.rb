# frozen_string_literal: true

require_relative "rack_helper"

# With Reactor#close_delay set, a fan-out's sockets are closed about as long after its writes as the writes took
# (close_delay at most): closing costs the kernel about what writing did, and meanwhile the other worker processes'
# loops and the clients still want the cores. Every reply carries its length, so no client waits for the close.
# Off by default (Reactor::CLOSE_DELAY): on a quiet machine it cost more than it gave.
class CloseLaterTest < Minitest::Test
  include Herald::RackHelpers

  # A trace whose first write takes SLOW seconds: the fan-out's writes took at least that long.
  class SlowWrites
    attr_reader :events

    def initialize = @events = Queue.new

    def start(_msg) = Recorder.new(@events)

    Recorder = Struct.new(:events, :writes) do
      def wrote
        sleep SLOW if (self.writes = (writes || 0) + 1) == 1
      end

      def written(_count) = events << [:written, now]

      def done = events << [:done, now]

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
  SLOW = 0.2
  DELAY = 0.05

  def test_the_sockets_are_closed_after_the_replies_as_long_again_as_the_writes_took
    mw = middleware(long_polling_interval: 10)
    server = puma(mw)
    trace = SlowWrites.new
    sockets = Array.new(3) { |i| server.request({"/c" => 0}, client: "c#{i}", headers: {"Dont-Chunk" => "t"}) }
    parked(mw, 3)
    mw.reactor.trace = trace
    mw.reactor.close_delay = DELAY
    @bus.publish("/c", "réponse 🎉")
    replies = sockets.map { |s| whole_reply(s) }
    assert_equal [["réponse 🎉"]] * 3, replies.map { |body| JSON.parse(body).map { |m| m["data"] } }
    event, written_at = trace.events.pop
    assert_equal :written, event
    sockets.each { |s| assert_nil read_to_end(s), "closed" }
    closed_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    # The writes took SLOW > CLOSE_DELAY: the closes come CLOSE_DELAY after them (before: at once).
    assert_operator closed_at - written_at, :>=, DELAY * 0.9
    assert_equal :done, trace.events.pop.first, "the trace is done once the sockets are closed"
  ensure
    sockets&.each(&:close)
  end

  # Clients that hang up before their sockets are closed: the loop stops watching them instead of being told
  # of them on every turn until then (a busy loop over CLOSE_DELAY).
  def test_clients_hanging_up_before_the_close_do_not_keep_the_loop_busy
    mw = middleware(long_polling_interval: 10)
    server = puma(mw)
    sockets = Array.new(50) { |i| server.request({"/c" => 0}, client: "c#{i}", headers: {"Dont-Chunk" => "t"}) }
    parked(mw, 50)
    trace = SlowWrites.new
    mw.reactor.trace = trace
    mw.reactor.close_delay = DELAY
    loop_thread = Thread.list.find { |t| t.name == "herald-reactor" }
    @bus.publish("/c", "x")
    sockets.each { |s| whole_reply(s) }
    trace.events.pop # written: the closes are DELAY away
    sockets.each(&:close)
    before = run_time(loop_thread)
    sleep DELAY
    assert_operator run_time(loop_thread) - before, :<, DELAY / 2, "CPU seconds the loop used meanwhile"
    assert_equal :done, trace.events.pop.first
  end

  private

  # CPU seconds the thread has run (Linux: /proc/self/task/TID/schedstat).
  def run_time(thread) = File.read("/proc/self/task/#{thread.native_thread_id}/schedstat").split.first.to_i / 1e9

  # The reply's bytes by its content-length, without waiting for the close.
  def whole_reply(socket)
    raw = +""
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    loop do
      head, body = raw.split("\r\n\r\n", 2)
      length = head && head[/^content-length: (\d+)/i, 1]
      return body.force_encoding(Encoding::UTF_8) if length && body.bytesize >= Integer(length)
      flunk "no whole reply within 5 s: #{raw.inspect}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      next unless socket.wait_readable(0.1)
      chunk = socket.read_nonblock(65_536, exception: false)
      flunk "closed before the whole reply: #{raw.inspect}" if chunk.nil?
      raw << chunk unless chunk == :wait_readable
    end
  end

  # nil once the server closed (within 2 s); the bytes if it sent more.
  def read_to_end(socket)
    return :timeout unless socket.wait_readable(2)
    socket.read_nonblock(1, exception: false)
  end
end
