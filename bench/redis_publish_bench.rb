# frozen_string_literal: true

# Where a Redis publish's time goes, Herald beside message_bus 4.5.1 on the same (own, spawned)
# redis-server, one and 4 threads, rows interleaved round by round, each library in a process of its own
# (as bench/log_ab_bench.rb does: two versions of Herald cannot share one). Besides the rate, figures that
# hold on a loaded machine: the client's CPU per publish (whole process), the server's CPU per publish
# (INFO cpu), script calls and Redis commands per publish (INFO commandstats; commands run inside a script
# count), the script's own time per call (usec_per_call), the publishing threads' context switches per
# publish (voluntary: the thread blocked; involuntary: it was preempted), objects per publish and, for
# Herald, how many records each script call carried (its Batcher's group sizes).
#
#   BENCH_ROUNDS=5 bundle exec ruby bench/redis_publish_bench.rb
#   BENCH_THREADS=1,4,8 BENCH_OPS=4000 ... (defaults 1,4 and 4000)
#   OLD_LIB=/tmp/old/lib ... adds the rows of another checkout of Herald
#     (git archive main lib | tar -x -C /tmp/old), measured in the same rounds (several: comma-separated)
#   BENCH_CALLGRIND=1 ... also counts the user-space instructions redis-server runs per publish
#     (a second redis-server under valgrind --tool=callgrind; BENCH_CALLGRIND_OPS publishes per row,
#     default 600) and those of each library's publishing process (its worker under callgrind, publishing
#     to the first server): figures no other load on the machine changes. The kernel's share (sockets,
#     thread wake-ups) is not in them, and callgrind runs one thread at a time, so with several threads
#     the client's count is of the same work scheduled differently.
require "json"
require_relative "support/script_worker"
require "rbconfig"
require_relative "harness"
require_relative "../test/support/servers"
require "redis-client"

OPS = Integer(ENV.fetch("BENCH_OPS", "4000"))
THREAD_COUNTS = ENV.fetch("BENCH_THREADS", "1,4").split(",").map { |t| Integer(t) }
OLD_LIBS = ENV["OLD_LIB"].to_s.split(",").map { |l| File.expand_path(l) }
OLD_LIB = OLD_LIBS.first

# One library in its own process: reads "threads ops" lines, publishes, answers with a JSON sample.
WORKER = <<~'RUBY'
  lib, url, namespace = ARGV
  $LOAD_PATH.unshift(lib) unless lib == "-"
  require "json"
  data = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
  channel = "/test/channel"
  groups = Hash.new(0)
  publish = if lib == "-"
    require "message_bus"
    mb = MessageBus::Instance.new
    mb.configure(backend: :redis, redis_config: {url: url})
    mb.backend_instance.max_backlog_size = 1000
    mb.backend_instance.reset!
    -> { mb.publish(channel, data) }
  else
    $VERBOSE = nil # the bundle's gemspec loaded this checkout's Herald::VERSION; another lib redefines it
    require "herald"
    # Counts the records of every script call the store makes (its Batcher's groups).
    Herald::Store::Redis.prepend(Module.new do
      define_method(:append_batch) do |requests|
        groups[requests.size] += 1
        super(requests)
      end
      private :append_batch
    end)
    bus = Herald::Bus.new(store: Herald::Store::Redis.new(url: url, namespace: namespace))
    -> { bus.publish(channel, data) }
  end
  switches = -> { File.read("/proc/thread-self/status").scan(/(\w+)_ctxt_switches:\s+(\d+)/).to_h { |k, v| [k, v.to_i] } }
  # n publishes over `threads` threads; returns the voluntary and involuntary switches they made.
  threaded = lambda do |n, threads|
    Array.new(threads) do |t|
      Thread.new do
        before = switches.call
        (n / threads + ((t < n % threads) ? 1 : 0)).times { publish.call }
        after = switches.call
        [after["voluntary"] - before["voluntary"], after["nonvoluntary"] - before["nonvoluntary"]]
      end
    end.map(&:value).transpose.map(&:sum)
  end
  $stdout.sync = true
  puts "ready"
  while (line = $stdin.gets)
    threads, n = line.split.map { |x| Integer(x) }
    GC.start
    groups.clear
    objects = GC.stat(:total_allocated_objects)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    voluntary, involuntary = threaded.call(n, threads)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    puts JSON.generate("rate" => n / t, "cpu_us" => cpu * 1e6 / n, "voluntary" => voluntary.fdiv(n),
      "involuntary" => involuntary.fdiv(n), "allocs" => (GC.stat(:total_allocated_objects) - objects).fdiv(n), "groups" => groups)
  end
RUBY

def spawn_worker(lib, url, namespace, prefix: []) = Bench::ScriptWorker.spawn(WORKER, lib, url, namespace, prefix: prefix)

def server_stats(redis)
  info = redis.call("INFO", "all")
  cpu = info[/used_cpu_user:([\d.]+)/, 1].to_f + info[/used_cpu_sys:([\d.]+)/, 1].to_f
  commands = info.scan(/^cmdstat_(\w+):calls=(\d+),usec=(\d+)/).to_h { |name, calls, usec| [name, [calls.to_i, usec.to_i]] }
  [cpu, commands]
end

# A worker's sample plus what the server did meanwhile.
def measure(redis, worker, threads, ops)
  cpu0, stats0 = server_stats(redis)
  sample = worker.run(threads, ops)
  cpu1, stats1 = server_stats(redis)
  delta = stats1.to_h { |name, (calls, usec)| [name, [calls - stats0.fetch(name, [0, 0])[0], usec - stats0.fetch(name, [0, 0])[1]]] }
  delta.delete("info")
  scripts = %w[evalsha eval].sum { |n| delta.fetch(n, [0, 0])[0] }
  script_usec = %w[evalsha eval].sum { |n| delta.fetch(n, [0, 0])[1] }
  sample.merge("server_us" => (cpu1 - cpu0) * 1e6 / ops, "scripts" => scripts.fdiv(ops),
    "script_us" => scripts.zero? ? 0 : script_usec.fdiv(scripts), "commands" => delta.sum { |_, (calls, _)| calls }.fdiv(ops))
end

server = Herald::TestServers.redis_server
url = server[:url]
redis = RedisClient.new(url: url)
libs = {"message_bus 4.5.1" => "-", "Herald" => File.expand_path("../lib", __dir__)}
OLD_LIBS.each { |l| libs[(OLD_LIBS.size == 1) ? "Herald (OLD_LIB)" : "Herald (#{l})"] = l }
workers = libs.each_with_index.to_h { |(name, lib), i| [name, spawn_worker(lib, url, "bench#{i}")] }
rows = THREAD_COUNTS.flat_map { |t| workers.map { |name, w| ["#{name}, #{t} thread#{"s" if t > 1}", t, w] } }
samples = Hash.new { |h, k| h[k] = [] }

load_before = Bench.loadavg
rows.each { |_, t, w| w.run(t, 1000) } # warm up: scripts loaded, backlogs full
Bench::ROUNDS.times do
  rows.each { |name, t, w| samples[name] << measure(redis, w, t, OPS) }
end
load_after = Bench.loadavg

med = ->(s, field) { Bench.median(s.map { |x| x[field] }) }
puts "### Redis publish: where the time goes", ""
puts "#{RUBY_DESCRIPTION}; redis-server #{redis.call("INFO", "server")[/redis_version:(\S+)/, 1]} (spawned for this run); " \
  "each library in its own process#{"; OLD_LIB: #{OLD_LIBS.join(", ")}" if OLD_LIB}. #{Bench::ROUNDS} rounds of #{OPS} publishes per row, rows interleaved; medians. " \
  "Load average #{load_before} before, #{load_after} after.", ""
puts "| | publishes/s | spread | vs message_bus | same-round ratio | client CPU/publish | server CPU/publish | script calls/publish | script usec/call | Redis commands/publish | switches/publish (voluntary + involuntary) | objects/publish |"
puts "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
rows.each do |name, t, _|
  s = samples[name]
  peer = samples[rows.find { |n, tt, _| tt == t && n.start_with?("message_bus") }[0]]
  base = med.call(peer, "rate")
  # Each round's rate over message_bus's in the same round (measured next to it): load that drifts
  # between rounds cancels out.
  paired = Bench.median(s.zip(peer).map { |a, b| a["rate"] / b["rate"] })
  puts format("| %s | %s | %s-%s | %.2fx | %.2fx | %.1f us | %.1f us | %.2f | %.1f | %.1f | %.2f + %.2f | %.1f |", name, Bench.humanize(med.call(s, "rate")),
    Bench.humanize(s.map { |x| x["rate"] }.min), Bench.humanize(s.map { |x| x["rate"] }.max), med.call(s, "rate") / base, paired, med.call(s, "cpu_us"),
    med.call(s, "server_us"), med.call(s, "scripts"), med.call(s, "script_us"), med.call(s, "commands"),
    med.call(s, "voluntary"), med.call(s, "involuntary"), med.call(s, "allocs"))
end
puts
rows.each do |name, _, _|
  sizes = samples[name].each_with_object(Hash.new(0)) { |x, h| x["groups"].each { |size, n| h[size.to_i] += n } }
  next if sizes.empty?
  total = sizes.sum { |size, n| size * n }
  shown = sizes.sort.map { |size, n| "#{size}: #{(100.0 * size * n / total).round(1)}%" }.join(", ")
  puts "- #{name}: publishes by the size of the script call that carried them: #{shown}"
end
puts
workers.each_value { |w| w.io.close }

# Instructions per publish in redis-server, counted by callgrind: each dump holds what ran since the last.
if ENV["BENCH_CALLGRIND"]
  require "tmpdir"
  require "socket"
  cg_ops = Integer(ENV.fetch("BENCH_CALLGRIND_OPS", "600"))
  dir = Dir.mktmpdir("herald-callgrind")
  port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
  pid = Process.spawn("valgrind", "--tool=callgrind", "--callgrind-out-file=#{dir}/cg.%p", "redis-server", "--port", port.to_s,
    "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, out: File::NULL, err: File::NULL)
  cg_url = "redis://127.0.0.1:#{port}/0"
  cg_redis = nil
  120.times do
    cg_redis = RedisClient.new(url: cg_url).tap { |r| r.call("PING") }
    break
  rescue RedisClient::ConnectionError
    sleep 0.5
  end
  raise "redis-server under valgrind did not start" unless cg_redis
  # Instructions since the last dump of the process under callgrind (a dump zeroes its counts).
  dumped = lambda do |process, files|
    system("callgrind_control", "-d", process.to_s, out: File::NULL, err: File::NULL)
    file = Dir[files].max_by { |f| File.mtime(f) }
    File.read(file)[/^summary: (\d+)/, 1].to_i.tap { Dir[files].each { |f| File.delete(f) } }
  end
  dump = -> { dumped.call(pid, "#{dir}/cg.*") }
  print_counts = lambda do |counts, t|
    base = counts.values.first
    counts.each { |name, ir| puts format("| %s, %d thread%s | %s | %.2fx |", name, t, (t > 1) ? "s" : "", Bench.humanize(ir), ir / base) }
  end
  cg_workers = libs.each_with_index.to_h { |(name, lib), i| [name, spawn_worker(lib, cg_url, "cg#{i}")] }
  puts "#### redis-server instructions per publish (callgrind, #{cg_ops} publishes per row after 1,200 to fill the backlogs)", ""
  puts "| | instructions/publish | vs message_bus |", "|---|---:|---:|"
  THREAD_COUNTS.each do |t|
    counts = cg_workers.to_h do |name, w|
      w.run(t, 1200) # backlogs full: both libraries trim as they go
      dump.call
      w.run(t, cg_ops)
      [name, dump.call.fdiv(cg_ops)]
    end
    print_counts.call(counts, t)
  end
  puts
  cg_workers.each_value { |w| w.io.close }
  # The publishing process's own instructions: its worker under callgrind, dumped (which zeroes the
  # counts) around the measured publishes (callgrind_control talks to it while it waits for its next
  # line), less a run of one publish a thread (the worker's GC.start and bookkeeping).
  client_dumps = ->(worker) { dumped.call(worker, "#{dir}/client.#{worker}*") }
  client_workers = libs.each_with_index.to_h do |(name, lib), i|
    [name, spawn_worker(lib, url, "cgc#{i}", prefix: ["valgrind", "--tool=callgrind", "--log-file=#{dir}/valgrind.log", "--callgrind-out-file=#{dir}/client.%p"])]
  end
  puts "#### Client instructions per publish (the publishing process under callgrind, #{cg_ops} publishes per row after 1,200)", ""
  puts "| | instructions/publish | vs message_bus |", "|---|---:|---:|"
  THREAD_COUNTS.each do |t|
    counts = client_workers.to_h do |name, w|
      w.run(t, 1200)
      client_dumps.call(w.io.pid)
      w.run(t, t)
      idle = client_dumps.call(w.io.pid)
      w.run(t, cg_ops + t)
      [name, (client_dumps.call(w.io.pid) - idle).fdiv(cg_ops)]
    end
    print_counts.call(counts, t)
  end
  puts
  client_workers.each_value { |w| w.io.close }
  cg_redis.close
  Process.kill(:TERM, pid)
  Process.wait(pid)
  FileUtils.rm_rf(dir)
end
