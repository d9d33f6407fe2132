# frozen_string_literal: true

# Several processes publishing into ONE Log directory at once (a Puma cluster whose workers all publish):
# aggregate Bus#publish rate over all processes, this code against older checkouts of Herald, with the
# rows measured round-robin (one round of every row, then the next) so load from other work hits every
# row alike. Each version runs in a process of its own (two versions of Herald cannot share one), which
# forks the publishing processes of each row.
#
#   bundle exec ruby bench/log_procs_bench.rb
#   OLD_LIBS=/tmp/old/lib bundle exec ruby bench/log_procs_bench.rb   # `git archive <commit> lib | tar -x -C /tmp/old`
#
# Without OLD_LIBS it compares with BASELINE_COMMITS from this clone's git history: f57f64d (an flock per
# append, issue 12 filed) and 5cdc6cd (the write lease handed over by datagrams). OLD_LIBS=none: no comparison.
#
# Rows: P processes x 1 thread, each publishing N messages (fsync :interval) to a channel of its own; the
# rate is all the processes' messages over the time from the first start to the last finish. "separate
# directories" runs 2 processes into a directory each: what the machine gives two processes that share
# nothing, the ceiling for two sharing one log. CPU us/op is the publishing processes' CPU time (every
# thread) over the messages: less sensitive to load than the rate. Lock columns (this code only): waits in
# a blocking flock, and "lease" datagrams, per 1,000 publishes.
require "json"
require_relative "support/script_worker"
require "rbconfig"
require "tmpdir"

ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "5"))
SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
NEW_LIB = File.expand_path("../lib", __dir__)
BASELINE_COMMITS = %w[f57f64d 5cdc6cd].freeze

OLD_LIBS = case ENV["OLD_LIBS"]
when "none" then {}
when nil, "" then BASELINE_COMMITS.to_h { |c| [c, Bench.commit_lib(c)] }.compact
else ENV["OLD_LIBS"].split(",").to_h { |l| [l, l] }
end

# Forks `procs` publishers per request; answers [rate, cpu us/op, lock waits, lease datagrams].
WORKER = <<~'RUBY'
  $LOAD_PATH.unshift(ARGV[0])
  $VERBOSE = nil # the bundle's gemspec loaded this checkout's Herald::VERSION; another lib redefines it
  require "herald"
  require "json"
  require "tmpdir"
  $stdout.sync = true
  puts "ready"
  while (line = $stdin.gets)
    procs, n, separate = line.split.map(&:to_i)
    root = Dir.mktmpdir("herald-procs")
    r, w = IO.pipe
    pids = Array.new(procs) do |i|
      fork do
        r.close
        dir = (separate == 1) ? File.join(root, i.to_s) : root
        bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir, fsync: :interval))
        bus.publish("/warm", "warm")
        w.puts "ready"
        w.flush
        sleep 0.3 # every process open (and listening) before any publishes
        cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        n.times { |j| bus.publish("/p#{i}", "message #{j}") }
        finished = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
        stats = bus.store.respond_to?(:lock_stats) ? bus.store.lock_stats.values_at(:waits, :asks) : [nil, nil]
        w.puts JSON.generate([started, finished, cpu, *stats])
        w.flush
        sleep 0.3 # the others may still be reading this one's records: closing would end its reservation
        bus.close
        exit!(0)
      end
    end
    w.close
    procs.times { r.gets }
    runs = Array.new(procs) { JSON.parse(r.gets) }
    pids.each { |pid| Process.wait(pid) }
    r.close
    FileUtils.rm_rf(root)
    span = runs.map { |x| x[1] }.max - runs.map { |x| x[0] }.min
    total = procs * n
    per_1k = ->(k) { runs.sum { |x| x[k] } * 1000.0 / total if runs.all? { |x| x[k] } }
    puts JSON.generate([total / span, runs.sum { |x| x[2] } * 1e6 / total, per_1k.call(3), per_1k.call(4)])
  end
RUBY

def spawn_worker(lib) = Bench::ScriptWorker.spawn(WORKER, lib)

n = [(10_000 * SCALE).to_i, 100].max
workers = {"this code" => spawn_worker(NEW_LIB)}
OLD_LIBS.each { |name, lib| workers[name] = spawn_worker(lib) }
rows = []
workers.each_key do |version|
  [1, 2, 8].each { |p| rows << ["#{version}: #{p} process#{"es" if p > 1}", version, p, false] }
end
rows.insert(3, ["this code: 2 processes, separate directories", "this code", 2, true])
load_before = File.read("/proc/loadavg").split.first(3).join(" ")
rows.each { |_, v, p, sep| workers[v].run(p, [n / 10, 100].max, sep ? 1 : 0) } # warm-up
samples = Hash.new { |h, k| h[k] = [] }
ROUNDS.times do
  rows.each { |label, v, p, sep| samples[label] << workers[v].run(p, n, sep ? 1 : 0) }
end
load_after = File.read("/proc/loadavg").split.first(3).join(" ")
median = ->(a) {
  s = a.sort
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
}
puts "### Log publish from several processes into one directory (fsync :interval)", ""
puts "Rows round-robin, #{ROUNDS} rounds, #{n} publishes per process. Load average #{load_before} before, #{load_after} after " \
  "(#{`nproc`.strip} cores shared with other work). Ratios: the median of each round's rate over the same version's " \
  "1-process rate in that round.", ""
puts "| | median | spread (min-max) | vs 1 process | CPU us/op | lock waits /1k | lease datagrams /1k |", "|---|---:|---:|---:|---:|---:|---:|"
rows.each do |label, version, *|
  rates = samples[label].map(&:first)
  one = samples["#{version}: 1 process"].map(&:first)
  ratio = median.call(rates.zip(one).map { |a, b| a / b })
  lock = [2, 3].map { |k| samples[label].first[k] ? format("%.1f", median.call(samples[label].map { |x| x[k] })) : "n/a" }
  puts format("| %s | %s ops/s | %s-%s | %.2fx | %.1f | %s | %s |", label, median.call(rates).round.to_s,
    rates.min.round.to_s, rates.max.round.to_s, ratio, median.call(samples[label].map { |x| x[1] }), *lock)
end
puts
workers.each_value { |w| w.io.close }
