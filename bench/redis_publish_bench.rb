# frozen_string_literal: true

# Where a Redis publish's time goes, Herald beside message_bus 4.5.1 on the same (own, spawned)
# redis-server, one and 4 threads, rows interleaved round by round. Besides the rate, figures that hold on
# a loaded machine: the client's CPU per publish (whole process), the server's CPU per publish (INFO cpu),
# script calls and Redis commands per publish (INFO commandstats; commands run inside a script count),
# the script's own time per call (usec_per_call), context switches per publish, objects per publish and,
# for Herald, how many records each script call carried (its Batcher's group sizes).
#
#   BENCH_ROUNDS=5 bundle exec ruby bench/redis_publish_bench.rb
#   BENCH_THREADS=1,4,8 BENCH_OPS=4000 ... (defaults 1,4 and 4000)
require_relative "harness"
require_relative "support/peers"
require_relative "../test/support/servers"
require "herald"

DATA = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
CHANNEL = "/test/channel"
OPS = Integer(ENV.fetch("BENCH_OPS", "4000"))
THREAD_COUNTS = ENV.fetch("BENCH_THREADS", "1,4").split(",").map { |t| Integer(t) }

# Counts the records of every script call Herald's store makes (its Batcher's groups).
module GroupSizes
  SIZES = Hash.new(0)

  private

  def append_batch(requests)
    SIZES[requests.size] += 1
    super
  end
end
Herald::Store::Redis.prepend(GroupSizes)

# Context switches of the calling thread (/proc counts them per thread; a process's own line is its main thread's).
def switches = File.read("/proc/thread-self/status").scan(/ctxt_switches:\s+(\d+)/).flatten.sum(&:to_i)

# Runs n publishes over `threads` threads; returns the context switches they made.
def threaded(n, threads)
  return switches.then { |before| n.times { yield } && switches - before } if threads == 1
  Array.new(threads) do |t|
    Thread.new do
      before = switches
      (n / threads + ((t < n % threads) ? 1 : 0)).times { yield }
      switches - before
    end
  end.sum(&:value)
end

def server_stats(redis)
  info = redis.call("INFO", "all")
  cpu = info[/used_cpu_user:([\d.]+)/, 1].to_f + info[/used_cpu_sys:([\d.]+)/, 1].to_f
  commands = info.scan(/^cmdstat_(\w+):calls=(\d+),usec=(\d+)/).to_h { |name, calls, usec| [name, [calls.to_i, usec.to_i]] }
  [cpu, commands]
end

Sample = Struct.new(:rate, :cpu_us, :server_us, :scripts, :script_us, :commands, :switches, :allocs)

def measure(redis, threads, ops, &publish)
  GC.start
  cpu0, stats0 = server_stats(redis)
  allocs0 = GC.stat(:total_allocated_objects)
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  sw = threaded(ops, threads, &publish)
  c1 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  t1 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  allocs = GC.stat(:total_allocated_objects) - allocs0
  cpu1, stats1 = server_stats(redis)
  delta = stats1.to_h { |name, (calls, usec)| [name, [calls - stats0.fetch(name, [0, 0])[0], usec - stats0.fetch(name, [0, 0])[1]]] }
  delta.delete("info")
  scripts = %w[evalsha eval].sum { |n| delta.fetch(n, [0, 0])[0] }
  script_usec = %w[evalsha eval].sum { |n| delta.fetch(n, [0, 0])[1] }
  commands = delta.sum { |_, (calls, _)| calls }
  Sample.new(ops / (t1 - t0), (c1 - c0) * 1e6 / ops, (cpu1 - cpu0) * 1e6 / ops, scripts.fdiv(ops),
    scripts.zero? ? 0 : script_usec.fdiv(scripts), commands.fdiv(ops), sw.fdiv(ops), allocs.fdiv(ops))
end

def med(samples, field) = Bench.median(samples.map(&field))

server = Herald::TestServers.redis_server
url = server[:url]
redis = RedisClient.new(url: url)
mb = MessageBus::Instance.new
mb.configure(backend: :redis, redis_config: {url: url})
mb.backend_instance.max_backlog_size = 1000
mb.backend_instance.reset!
herald = Herald::Bus.new(store: Herald::Store::Redis.new(url: url, namespace: "bench"))
variants = {"message_bus 4.5.1" => ->(_) { mb.publish(CHANNEL, DATA) }, "Herald" => ->(_) { herald.publish(CHANNEL, DATA) }}
if ENV["BENCH_RUBY_DRIVER"]
  ruby = Herald::Bus.new(store: Herald::Store::Redis.new(url: url, namespace: "benchrb", driver: :ruby))
  variants["Herald, Ruby driver"] = ->(_) { ruby.publish(CHANNEL, DATA) }
end
rows = THREAD_COUNTS.flat_map { |t| variants.map { |name, run| ["#{name}, #{t} thread#{"s" if t > 1}", t, run] } }
samples = Hash.new { |h, k| h[k] = [] }
groups = Hash.new { |h, k| h[k] = Hash.new(0) }

load_before = Bench.loadavg
rows.each { |_, t, run| threaded(1000, t) { run.call(nil) } } # warm up: scripts loaded, backlogs full
Bench::ROUNDS.times do
  rows.each do |name, t, run|
    GroupSizes::SIZES.clear
    samples[name] << measure(redis, t, OPS) { run.call(nil) }
    GroupSizes::SIZES.each { |size, n| groups[name][size] += n }
  end
end

puts "### Redis publish: where the time goes", ""
puts "#{RUBY_DESCRIPTION}; redis-server #{redis.call("INFO", "server")[/redis_version:(\S+)/, 1]} (spawned for this run); " \
  "Herald's driver: #{herald.store.driver}. #{Bench::ROUNDS} rounds of #{OPS} publishes per row, rows interleaved; medians. " \
  "Load average #{load_before} before, #{Bench.loadavg} after.", ""
puts "| | publishes/s | spread | vs message_bus | client CPU/publish | server CPU/publish | script calls/publish | script usec/call | Redis commands/publish | context switches/publish | objects/publish |"
puts "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
rows.each do |name, t, _|
  s = samples[name]
  base = Bench.median(samples[rows.find { |n, tt, _| tt == t && n.start_with?("message_bus") }[0]].map(&:rate))
  puts format("| %s | %s | %s-%s | %.2fx | %.1f us | %.1f us | %.2f | %.1f | %.1f | %.2f | %.1f |", name, Bench.humanize(med(s, :rate)),
    Bench.humanize(s.map(&:rate).min), Bench.humanize(s.map(&:rate).max), med(s, :rate) / base, med(s, :cpu_us),
    med(s, :server_us), med(s, :scripts), med(s, :script_us), med(s, :commands), med(s, :switches), med(s, :allocs))
end
puts
groups.each do |name, sizes|
  total = sizes.sum { |size, n| size * n }
  shown = sizes.sort.map { |size, n| "#{size}: #{(100.0 * size * n / total).round(1)}%" }.join(", ")
  puts "- #{name}: publishes by the size of the script call that carried them: #{shown}"
end
puts
herald.close
mb.destroy
