# frozen_string_literal: true

# Publish -> delivery latency to 1,000 and 10,000 parked long-poll clients, measured by the clients and, for
# Herald, inside the server. A separate process parks the polls, publishes one message carrying its wall
# clock, and takes each client's latency when its reply is complete.
#
# The client is a small C program (bench/support/latency_client.c, compiled with cc into tmp/ when the bench
# starts): it opens the N connections, sends the same message_bus poll requests as a browser would
# (Dont-Chunk long polls), waits with epoll and stamps each reply's arrival with CLOCK_REALTIME right after
# the read that completed it, the clock the publish was stamped with. It costs 5-10 us of CPU per reply here,
# nearly all of it the kernel's read(2) on loopback (its reply buffers are touched before the publish: their
# first-touch page faults took a third of that inside the measured window), and on 2 shared cores that is
# CPU the server being measured does not get: at 10,000 clients 50-100 ms of a core. The Ruby client
# (bench/support/http_clients.rb, nio4r; BENCH_CLIENT=ruby, and the fallback without a C compiler) spends
# tens of microseconds per reply, as much as the server's writes, so its figures were largely its own.
# Every row uses the same client. "client CPU/client": the client process's own CPU per client over the round
# (connecting and sending the poll included: 10 ms ticks), and from the publish to the last reply (the C client
# only, its own clock).
#
# The server stamps its own clock when the publish request arrives, and its event loop records when it
# handed each reply to the kernel (bench/support/fan_out_trace.rb): the server-side latency of a client is
# that write time minus the stamp, so it leaves out the client process's own share of the 2 cores.
# Every server runs at once and the rounds alternate between them, so drifting load hits all alike.
#
#   BENCH_LATENCY_CLIENTS=1000,10000 (default) BENCH_ROUNDS=3 bundle exec ruby bench/http_latency_bench.rb
#   BENCH_HERALD_WORKERS=1,2 adds a row per worker count (default 1) for each Herald front end:
#   BENCH_HERALD_FRONTS=puma,herald (default both: the middleware on Puma, how an app embeds Herald, and
#   `herald server`'s own front end, the default server). BENCH_CLIENT=ruby|c (default c).
#   BENCH_OLD_ROOT=/tmp/old adds, after each Herald row, the same row served by another tree's lib (made with
#   `git archive main lib test/support | tar -x -C /tmp/old`, then this tree's bench/support copied in for the
#   same trace), alternating with the others in the same rounds: an A/B comparison that the machine's drifting
#   load hits alike. Several trees: comma-separated.
require_relative "harness"
require_relative "support/http_servers"
require_relative "support/fan_out_trace"
require "herald"
require "json"
require "fileutils"

COUNTS = ENV.fetch("BENCH_LATENCY_CLIENTS", "1000,10000").split(",").map { |n| [(Integer(n) * Bench::SCALE).to_i, 10].max }
ROUNDS = [Bench::ROUNDS, 3].max
WORKERS = ENV.fetch("BENCH_HERALD_WORKERS", "1").split(",").map { |n| Integer(n) }
FRONTS = ENV.fetch("BENCH_HERALD_FRONTS", "puma,herald").split(",")

Process.setrlimit(:NOFILE, Process.getrlimit(:NOFILE)[1]) # the servers inherit it (SpawnedServer)

OLD_ROOTS = ENV.fetch("BENCH_OLD_ROOT", "").split(",").map { |root| File.expand_path(root) }
FRONT_NAMES = {"puma" => "Herald middleware on Puma", "herald" => "herald server"}.freeze
IMPLS = Bench::IMPLS.flat_map do |name, impl|
  next [[name, impl]] unless impl == "herald"
  FRONTS.product(WORKERS).flat_map do |front, n|
    label = FRONT_NAMES.fetch(front) + ((n == 1) ? "" : ", #{n} worker processes")
    args = ["--trace", "--front", front, *(["--workers", n.to_s] if n > 1)]
    rows = [[label, [impl, args]]]
    rows + OLD_ROOTS.map { |root| ["#{label} (#{File.basename(root)})", [impl, args, root]] }
  end
end.to_h

# The measuring client: the C one unless BENCH_CLIENT=ruby or it does not compile.
def client_command
  ruby = [RbConfig.ruby, File.join(Bench::HTTP_ROOT, "bench/support/http_clients.rb"), "latency"]
  return ruby if ENV["BENCH_CLIENT"] == "ruby"
  source = File.join(Bench::HTTP_ROOT, "bench/support/latency_client.c")
  binary = File.join(Bench::HTTP_ROOT, "tmp/latency_client")
  FileUtils.mkdir_p(File.dirname(binary))
  return [binary] if system(ENV.fetch("CC", "cc"), "-O2", "-o", binary, source)
  warn "bench: cc could not build #{source}; measuring with the Ruby client"
  ruby
end
CLIENT = client_command
CLIENT_NAME = (CLIENT.first == RbConfig.ruby) ? "Ruby (nio4r)" : "C (epoll)"

Round = Struct.new(:client_ms, :missed, :server_ms, :last_write_ms, :cpu_us, :objects, :process_cpu_us, :client_cpu_us, :client_wait_cpu_us, :starts_ms,
  :loop_runq_ms, :client_runq_ms, :gcs)

# CPU seconds of the server and its worker processes (a worker row's parent only forks and waits).
def server_cpu(pid)
  children = File.read("/proc/#{pid}/task/#{pid}/children").split.map { |c| Integer(c) }
  Bench.cpu_seconds(pid) + children.sum { |c| Bench.cpu_seconds(c) }
rescue Errno::ENOENT
  0.0
end

# One round (one publish to `clients` parked polls).
def measure_round(server, clients, traced:)
  command = [*CLIENT, server.port.to_s, clients.to_s, "1"]
  Bench::FanOutTrace.collect(server.dir) # forget the warm-up's
  cpu_before = server_cpu(server.pid)
  client_before = Process.times.then { |t| t.cutime + t.cstime }
  lines = IO.popen({"LATENCY_STATS" => "1"}, command, &:readlines).map { |line| JSON.parse(line) }
  stats = lines.last.is_a?(Hash) ? lines.pop : {}
  client_cpu = Process.times.then { |t| t.cutime + t.cstime } - client_before
  raise "client process failed" unless $?.success? && lines.size == 1
  samples = lines.flatten
  round = Round.new(samples.compact.map { |s| s * 1000 }, samples.count(&:nil?) + (clients - samples.size))
  round.client_cpu_us = client_cpu * 1e6 / clients
  round.client_wait_cpu_us = stats["wait_cpu"] && stats["wait_cpu"] * 1e6 / clients
  round.client_runq_ms = stats["runq"] * 1000 if stats["runq"]&.>=(0)
  # The server's CPU once its loops wrote their records, which they do after closing the round's sockets
  # (later than the client's last read, Reactor::CLOSE_DELAY): so the closes count in the round's CPU.
  traces = round_traces(server.dir, clients, traced: traced)
  round.process_cpu_us = (server_cpu(server.pid) - cpu_before) * 1e6 / clients
  server_side(round, traces)
  round
end

# The round's fan-out records. A loop writes its record after its closes, which on a loaded machine can end
# after the client is done: wait for them (up to 3 s) rather than lose the round's server-side figures.
def round_traces(dir, clients, traced:)
  traces = {}
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + (traced ? 3 : 0)
  loop do
    Bench::FanOutTrace.collect(dir).each { |id, records| (traces[id] ||= []).concat(records) }
    answered = traces.values.map { |list| list.sum { |r| r["answered"] } }.max || 0
    return traces if answered >= clients || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    sleep 0.05
  end
end

# The fan-out of the round's message, from every worker process that holds clients of it.
def server_side(round, traces)
  records = traces.values.max_by { |list| list.sum { |r| r["writes"].size } } or return
  round.server_ms = records.flat_map { |r| r["writes"].map { |w| (w - r["st"]) * 1000 } }
  round.last_write_ms = records.map { |r| (r["last_write"] - r["st"]) * 1000 }.max
  # When each process's loop began its fan-out, after the stamp: the publishing one, then the others (woken
  # through the log's cross-process wakeup).
  round.starts_ms = records.map { |r| (r["started"] - r["st"]) * 1000 }.minmax
  # Time the event loops spent runnable but without a CPU from their start to their last write (the worst
  # process), and the GCs that ran in them meanwhile: what the machine, not Herald's code, adds to a round.
  waits = records.filter_map { |r| r["waited"][1] - r["waited"][0] if r["waited"]&.first(2)&.all? }
  round.loop_runq_ms = waits.max * 1000 unless waits.empty?
  round.gcs = records.sum { |r| r["gcs"] ? r["gcs"][1] - r["gcs"][0] : 0 }
  answered = records.sum { |r| r["answered"] }
  return if answered.zero?
  # Per answered client, over every process: CPU of the event loop thread (write loop + bookkeeping), objects.
  round.cpu_us = records.sum { |r| r["cpu"].last - r["cpu"].first } * 1e6 / answered
  round.objects = records.sum { |r| r["objects"].last - r["objects"].first }.fdiv(answered)
  return unless ENV["BENCH_DEBUG"]
  records.each do |r|
    warn format("pid %d: %d answered; stamp->start %.1f ms, writes %.1f ms, bookkeeping+closes %.1f ms; cpu writes %.1f ms, after %.1f ms; " \
      "waited for a CPU during writes %.1f ms; client waited %.1f ms",
      r["pid"], r["answered"], (r["started"] - r["st"]) * 1000, (r["last_write"] - r["started"]) * 1000,
      (r["done"] - r["last_write"]) * 1000, (r["cpu"][1] - r["cpu"][0]) * 1000, (r["cpu"][2] - r["cpu"][1]) * 1000,
      ((r.dig("waited", 1) || 0) - (r.dig("waited", 0) || 0)) * 1000, round.client_runq_ms || -1)
  end
end

def fmt(value, digits = 1) = value ? format("%.#{digits}f", value) : "-"

load_before = Bench.loadavg
results = Hash.new { |h, k| h[k] = Hash.new { |hh, kk| hh[kk] = [] } }
Bench.with_http_servers(IMPLS) do |servers|
  COUNTS.each do |clients|
    ROUNDS.times do
      servers.each do |name, server|
        traced = IMPLS[name].is_a?(Array) && IMPLS[name][1].include?("--trace")
        results[clients][name] << measure_round(server, clients, traced: traced)
      end
    end
  end
end
load_after = Bench.loadavg

COUNTS.each do |clients|
  rows = results[clients]
  base_name = rows.keys.first
  base_p99 = Bench.percentile(rows[base_name].flat_map(&:client_ms).sort, 0.99)
  puts "### Publish -> delivery latency, #{clients} parked long-poll clients", ""
  puts "One server process per row (Puma with #{Bench::THREADS} threads in front of the middleware, or herald server's own " \
       "front end; a worker row is that many processes on one port, as `herald server --workers N`), all up " \
       "at once; one #{CLIENT_NAME} client process holding #{clients} connections (POST /message-bus/<id>/poll with `Dont-Chunk: true`), " \
       "#{ROUNDS} rounds of one publish each, alternating between the servers. Client: receive time - publish time " \
       "stamped by the client. Server (Herald): the time its event loop handed each client's reply to the kernel - " \
       "the time the publish request reached the server; last write: the same for the round's last client (median, " \
       "max over rounds); fan-out start: when the event loop began the fan-out, after that stamp (medians over rounds; with " \
       "workers, the first process's and the last one's, woken through the log's cross-process wakeup). p50/p99 over every client of every round; the spread is the min-max of the per-round p99. " \
       "CPU and objects: the event loops' thread CPU time and allocations per answered client (writes, unindexing, " \
       "closes), which do not depend on the machine's load; server CPU: the whole server's (every process, /proc) over the " \
       "round per client, accepting and parking its poll as well as answering it, for message_bus too (10 ms ticks); client CPU: " \
       "the client process's per client, over the round (connecting and sending the poll too) and from the publish to the last reply " \
       "(reading; the C client only). Waited for a CPU: how long, from the fan-out's start to its last write, the event " \
       "loop (the slowest process) was runnable with no CPU free, and how long the client was, from the publish to its last " \
       "reply (the kernel's schedstat; median, max over rounds): time the machine's other work took, not Herald's code; " \
       "GCs: garbage collections in the loops over those spans, every round. Load average #{load_before} before, #{load_after} after " \
       "(2 cores shared with other work). #{Bench.store_note}", ""
  puts "| | client p50 | client p99 | per-round p99 (min-max) | max | p99 vs #{base_name} | server p50 | server p99 | " \
       "last write (median, max) | fan-out start (first, last process) | CPU/client | objects/client | server CPU/client | client CPU/client (round, reading) | waited for a CPU: loop, client (median, max) | GCs | missed |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  rows.each do |name, list|
    ms = list.flat_map(&:client_ms).sort
    missed = list.sum(&:missed)
    next puts "| #{name} | - | - | - | - | - | - | - | - | - | - | - | - | - | - | - | #{missed} |" if ms.empty?
    p99s = list.map { |r| Bench.percentile(r.client_ms.sort, 0.99) }.compact
    server = list.flat_map { |r| r.server_ms || [] }.sort
    last = list.map(&:last_write_ms).compact
    starts = list.map(&:starts_ms).compact
    cpu = list.map(&:cpu_us).compact
    objects = list.map(&:objects).compact
    loop_waits = list.map(&:loop_runq_ms).compact
    client_waits = list.map(&:client_runq_ms).compact
    waits = [loop_waits, client_waits].map { |l| l.empty? ? "-" : "#{fmt(Bench.median(l))}, #{fmt(l.max)}" }.join("; ")
    p99 = Bench.percentile(ms, 0.99)
    puts "| #{name} | #{fmt(Bench.percentile(ms, 0.5))} ms | #{fmt(p99)} ms | #{fmt(p99s.min)}-#{fmt(p99s.max)} ms | " \
         "#{fmt(ms.last)} ms | #{format("%.2fx", p99 / base_p99)} | " \
         "#{server.empty? ? "-" : "#{fmt(Bench.percentile(server, 0.5))} ms"} | " \
         "#{server.empty? ? "-" : "#{fmt(Bench.percentile(server, 0.99))} ms"} | " \
         "#{last.empty? ? "-" : "#{fmt(Bench.median(last))}, #{fmt(last.max)} ms"} | " \
         "#{starts.empty? ? "-" : "#{fmt(Bench.median(starts.map(&:first)), 2)}, #{fmt(Bench.median(starts.map(&:last)), 2)} ms"} | " \
         "#{cpu.empty? ? "-" : "#{fmt(Bench.median(cpu))} us"} | #{objects.empty? ? "-" : fmt(Bench.median(objects), 2)} | " \
         "#{fmt(Bench.median(list.map(&:process_cpu_us)), 0)} us | #{fmt(Bench.median(list.map(&:client_cpu_us)), 0)}, #{fmt(Bench.median(list.filter_map(&:client_wait_cpu_us).then { |l| l.empty? ? [nil] : l }))} us | " \
         "#{waits} ms | #{loop_waits.empty? ? "-" : list.sum { |r| r.gcs || 0 }} | #{missed} |"
  end
  puts
  targets = (clients == 1000) ? "server p99 <= 15 ms, client p99 <= 25 ms" : "client p99 <= 150 ms"
  puts "Targets (#{clients} clients): #{targets}. The client process shares the 2 cores with the servers, so its " \
       "own reading of #{clients} sockets is part of the client figures (see client CPU/client).", ""
end
