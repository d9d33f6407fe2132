# frozen_string_literal: true

# Where the event loop's CPU goes when one message is fanned out to N parked long polls, per client, in
# the loop thread's own CPU time (CLOCK_THREAD_CPUTIME_ID), which other work on the machine changes far less
# than wall-clock time. Three rows per round, interleaved:
#
# - kernel floor: a bare Ruby loop calling write_nonblock with the same reply bytes on N freshly accepted
#   loopback TCP sockets, then close on each: what write(2)/close(2) cost with no Herald code at all;
# - Herald::Rack::Reactor on N such sockets (parked through Reactor#park, woken by Bus#publish): the write
#   phase (positions, permission check, shared reply, write, until the last write) and the bookkeeping after
#   it (unindexing, closing the sockets, nio4r deregistration);
# - the same reactor on IOs whose write_nonblock takes everything without a system call: Herald's own Ruby
#   work per client in the write phase, alone (their bookkeeping still closes a pipe and deregisters it from
#   nio4r: a close(2) and an epoll_ctl(2) per client remain in that column).
#
# The peers are plain sockets of this process that never read (a real client's reading and ACKs happen on
# its own CPU; bench/http_latency_bench.rb measures them end to end).
#
#   BENCH_ROUNDS=5 BENCH_FAN_OUT_CLIENTS=1000 bundle exec ruby bench/fan_out_cpu_bench.rb
require_relative "harness"
require "herald"
require "socket"

CLIENTS = [(Integer(ENV.fetch("BENCH_FAN_OUT_CLIENTS", "1000")) * Bench::SCALE).to_i, 10].max
REPLY = ("HTTP/1.1 200 OK\r\n" + "x" * 260).freeze # about a real one-message reply's size
Process.setrlimit(:NOFILE, Process.getrlimit(:NOFILE)[1])

def thread_cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)

# Reactor#trace: the loop's CPU at the start, after the last write and after the bookkeeping.
class CpuTrace
  def initialize = @rounds = Queue.new

  def start(_msg) = Recorder.new(@rounds)

  def pop = @rounds.pop

  Recorder = Struct.new(:rounds, :cpu, :count) do
    def initialize(rounds) = super(rounds, [thread_cpu], 0)

    def wrote = nil

    def written(count)
      cpu << thread_cpu
      self.count = count
    end

    def done
      cpu << thread_cpu
      rounds << [(cpu[1] - cpu[0]) * 1e6 / count, (cpu[2] - cpu[1]) * 1e6 / count, count]
    end
  end
end

# An IO whose writes cost no system call (its descriptor is a pipe's, so nio4r can register it).
class FreeIO < IO
  def write_nonblock(bytes, exception: true) = bytes.bytesize
end

def loopback_pairs(listener, count)
  Array.new(count) { [Socket.tcp("127.0.0.1", listener.local_address.ip_port), listener.accept] }.transpose
end

def bare_round(listener)
  peers, sockets = loopback_pairs(listener, CLIENTS)
  before = thread_cpu
  sockets.each { |s| s.write_nonblock(REPLY, exception: false) }
  written = thread_cpu
  sockets.each(&:close)
  closed = thread_cpu
  peers.each(&:close)
  [(written - before) * 1e6 / CLIENTS, (closed - written) * 1e6 / CLIENTS]
end

def reactor_round(env, ios, round)
  bus, reactor, trace = env
  last = bus.last_id("/fan")
  ios.each_with_index do |io, i|
    client = Herald::Rack::Client.new(id: "c#{round}-#{i}", user_id: nil, group_ids: nil, site_id: nil, seq: 0,
      positions: {"/fan" => last})
    conn = Herald::Rack::SocketConnection.new(io: io, extra_headers: "", max_buffer: 1 << 20, client: client,
      mode: :poll, encoding: :json, wire: reactor.instance_variable_get(:@wire))
    conn.deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    reactor.park(conn, [], nil, bus.store.last_global_id)
  end
  sleep 0.01 until reactor.size == CLIENTS
  bus.publish("/fan", {"n" => round})
  writes, after, count = trace.pop
  raise "answered #{count} of #{CLIENTS}" unless count == CLIENTS
  [writes, after]
end

def socket_round(env, listener, round)
  peers, sockets = loopback_pairs(listener, CLIENTS)
  reactor_round(env, sockets, round).tap { peers.each(&:close) }
end

# The reactor closes each FreeIO, hence the pipe's read end: the original IO object must not close it again.
def free_round(env, round)
  pipes = Array.new(CLIENTS) { IO.pipe }
  ios = pipes.map do |r, _|
    r.autoclose = false
    FreeIO.for_fd(r.fileno)
  end
  reactor_round(env, ios, round).tap { pipes.each { |_, w| w.close } }
end

listener = TCPServer.new("127.0.0.1", 0)
listener.listen(4096)
bus = Herald::Bus.new(store: Herald::Store::Memory.new)
trace = CpuTrace.new
reactor = Herald::Rack::Reactor.new(bus: bus, wire: Herald::Rack::Wire.new, filters: [], write_timeout: 10,
  on_error: ->(e) { warn "fan_out_cpu_bench: #{e.class}: #{e.message}" })
reactor.trace = trace
env = [bus, reactor, trace]
load_before = Bench.loadavg
rows = {"kernel floor: bare write_nonblock, close" => [], "Herald reactor, loopback sockets" => [],
        "Herald reactor, writes without system calls (Ruby alone)" => []}
socket_round(env, listener, -1) # warm-up
[Bench::ROUNDS, 3].max.times do |round|
  rows.values[0] << bare_round(listener)
  rows.values[1] << socket_round(env, listener, round)
  rows.values[2] << free_round(env, round)
end
reactor.close
bus.close

def cell(values) = format("%.2f us (%.2f-%.2f)", Bench.median(values), values.min, values.max)

puts "### Fan-out CPU per client (#{CLIENTS} parked long polls, one message)", ""
puts "The event loop thread's CPU time per client (median of #{rows.values.first.size} interleaved rounds, min-max): " \
     "writes = from the fan-out's start to its last write (the bare loop: the write_nonblock calls alone); after = " \
     "unindexing and closing (the bare loop: close alone). Peers are sockets of the same process that do not read. " \
     "Load average #{load_before} before, #{Bench.loadavg} after (2 cores shared with other work). `#{RUBY_DESCRIPTION}`.", ""
puts "| | writes | after (bookkeeping, deregistration, closes) |", "|---|---:|---:|"
rows.each { |name, list| puts "| #{name} | #{cell(list.map(&:first))} | #{cell(list.map(&:last))} |" }
puts
