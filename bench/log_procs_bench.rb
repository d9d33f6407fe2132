# frozen_string_literal: true

# Several processes publishing into ONE Log directory at once (a Puma cluster whose workers all publish):
# 1, 2, 4 and 8 processes, fsync :interval and :always, this code against an older checkout, with the rows
# measured round-robin (one round of every row, then the next) so load from other work hits every row
# alike. Each version runs in a worker process of its own (two versions of Herald cannot share one), which
# forks the publishing processes of each row. Beside them, in the same rounds: 2 processes into separate
# directories (what the machine gives two processes that share nothing: the ceiling for two sharing one
# log), and for :always the C group commit without the GVL (bench/support/group_commit.c) with as many
# threads as there are processes: the disk's ceiling for that many publishers sharing fsyncs.
#
#   bundle exec ruby bench/log_procs_bench.rb                      # BENCH_ROUNDS=3 BENCH_SCALE=1
#   OLD_LIBS=/tmp/old/lib bundle exec ruby bench/log_procs_bench.rb  # `git archive <commit> lib | tar -x -C /tmp/old`
#
# Without OLD_LIBS it compares with BASELINE_COMMITS from this clone's git history (d22d509: the write lease
# before issue 28). OLD_LIBS=none: no comparison.
#
# A row: P processes x 1 thread publish TOTAL/P messages each, to a channel of their own and (every other
# message) to one channel they share; the rate is all the messages over the time from the first start to
# the last finish. CPU us/op: the publishing processes' CPU time (every thread) over the messages, less
# sensitive to load than the rate. Leases /1k: write leases taken (each one a handoff between processes)
# per 1,000 publishes; /s: the same per second. Fairness: the slowest process's rate over the fastest's
# (1.00: even). After every run the directory is read back by a fresh store: global ids dense and in file
# order (the order readers read them in), each channel's ids dense, each process's messages in its own
# order; "ids ok" counts the runs that passed (a failing run is reported, never hidden).
require "json"
require_relative "support/script_worker"
require "fileutils"
require "rbconfig"
require "tmpdir"

ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "3"))
SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
NEW_LIB = File.expand_path("../lib", __dir__)
BASELINE_COMMITS = %w[d22d509].freeze
PROCS = [1, 2, 4, 8].freeze
TOTAL = {interval: [(20_000 * SCALE).to_i, 400].max, always: [(800 * SCALE).to_i, 64].max}.freeze

OLD_LIBS = case ENV["OLD_LIBS"]
when "none" then {}
when nil, "" then BASELINE_COMMITS.to_h { |c| [c, Bench.commit_lib(c)] }.compact
else ENV["OLD_LIBS"].split(",").to_h { |l| [l, l] }
end

# Answers "PROCS PER_PROCESS SEPARATE FSYNC" with [rate, cpu us/op, leases, waits, asks, fairness, ids ok].
WORKER = <<~'RUBY'
  $LOAD_PATH.unshift(ARGV[0])
  $VERBOSE = nil # the bundle's gemspec loaded this checkout's Herald::VERSION; another lib redefines it
  require "herald"
  require "json"
  require "tmpdir"
  $stdout.sync = true

  # Global ids 1..n in file order, each channel's ids dense, each process's messages in its own order.
  def ids_ok?(dir, procs, n)
    store = Herald::Store::Log.new(dir: dir, fsync: :never, max_backlog_size: 1_000_000)
    all = store.global_backlog(0)
    store.close
    return false unless all.map(&:global_id) == (1..all.size).to_a && all.size == procs * (n + 1)
    return false unless all.group_by(&:channel).all? { |_, m| m.map(&:message_id) == (1..m.size).to_a }
    all.reject { |m| m.channel == "/warm" }.group_by { |m| m.data[0] }.all? { |_, m| m.map { |x| x.data[1] } == (0...n).to_a }
  end

  puts "ready"
  while (line = $stdin.gets)
    procs, n, separate, fsync = line.split
    procs = Integer(procs)
    n = Integer(n)
    root = Dir.mktmpdir("herald-procs")
    r, w = IO.pipe
    pids = Array.new(procs) do |i|
      fork do
        r.close
        dir = (separate == "1") ? File.join(root, i.to_s) : root
        store = Herald::Store::Log.new(dir: dir, fsync: fsync.to_sym, max_backlog_size: 1_000_000)
        bus = Herald::Bus.new(store: store)
        bus.publish("/warm", [i, -1])
        w.puts "ready"
        w.flush
        sleep 0.3 # every process open (and listening) before any publishes
        before = store.respond_to?(:lock_stats) ? store.lock_stats : {}
        cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        n.times { |j| bus.publish(j.even? ? "/shared" : "/p#{i}", [i, j]) }
        finished = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
        after = store.respond_to?(:lock_stats) ? store.lock_stats : {}
        stats = %i[leases waits asks].map { |k| after[k] && after[k] - before[k] }
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
    ok = (separate == "1") || ids_ok?(root, procs, n)
    FileUtils.rm_rf(root)
    span = runs.map { |x| x[1] }.max - runs.map { |x| x[0] }.min
    total = procs * n
    sum = ->(k) { runs.sum { |x| x[k] } if runs.all? { |x| x[k] } }
    rates = runs.map { |x| n / (x[1] - x[0]) }
    puts JSON.generate([total / span, sum.call(2) * 1e6 / total, sum.call(3), sum.call(4), sum.call(5), rates.min / rates.max, ok ? 1 : 0, total])
  end
RUBY

def spawn_worker(lib) = Bench::ScriptWorker.spawn(WORKER, lib)

# The C group commit as a worker answering "THREADS RECORDS" ([records/s, 0, CPU us a record, ...]), or nil.
def spawn_c_worker
  source = File.expand_path("support/group_commit.c", __dir__)
  binary = File.expand_path("../tmp/group_commit", __dir__)
  FileUtils.mkdir_p(File.dirname(binary))
  return warn("bench: cc could not build #{source}; no C rows") unless system(ENV.fetch("CC", "cc"), "-O2", "-pthread", "-o", binary, source)
  dir = Dir.mktmpdir("herald-gc")
  at_exit { FileUtils.rm_rf(dir) }
  io = IO.popen([binary, File.join(dir, "gc.dat"), "-", "500"], "r+")
  raise "#{binary} did not start" unless io.gets == "ready\n"
  Bench::ScriptWorker.new(io)
end

workers = {"this code" => spawn_worker(NEW_LIB)}
OLD_LIBS.each { |name, lib| workers[name] = spawn_worker(lib) }
c_worker = spawn_c_worker
C_LABEL = "C group commit (threads, no GVL)"
Row = Struct.new(:label, :fsync, :procs, :run)
rows = []
%i[interval always].each do |fsync|
  workers.each do |version, worker|
    PROCS.each do |p|
      n = TOTAL[fsync] / p
      rows << Row.new("#{version}, :#{fsync}, #{p} process#{"es" if p > 1}", fsync, p, -> { worker.run(p, n, 0, fsync) })
    end
  end
  rows << Row.new("this code, :interval, 2 processes, separate directories", fsync, 2, -> { workers["this code"].run(2, TOTAL[:interval] / 2, 1, :interval) }) if fsync == :interval
  next unless fsync == :always && c_worker
  PROCS.each do |p|
    n = TOTAL[:always] / p * p
    rows << Row.new("#{C_LABEL}, #{p} thread#{"s" if p > 1}", fsync, p, -> { c_worker.run(p, n).values_at(0, 2) })
  end
end
load_before = File.read("/proc/loadavg").split.first(3).join(" ")
samples = Hash.new { |h, k| h[k] = [] }
ROUNDS.times do
  rows.each { |row| samples[row.label] << row.run.call }
end
load_after = File.read("/proc/loadavg").split.first(3).join(" ")
median = ->(a) {
  s = a.compact.sort
  next nil if s.empty?
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
}
fmt = ->(v, f = "%.1f") { v ? format(f, v) : "-" }
# The median over rounds of this row's rate over another row's rate in the same round.
ratio = ->(row, base) { base && median.call(samples[row].zip(samples[base]).map { |a, b| a[0] / b[0] }) }

puts "### Log publish from several processes into one directory", ""
puts "Rows round-robin, #{ROUNDS} rounds; #{TOTAL[:interval]} publishes a row with :interval, #{TOTAL[:always]} with :always, split " \
  "between the processes. Load average #{load_before} before, #{load_after} after (#{`nproc`.strip} cores shared with other work). " \
  "Ratios: the median of each round's ratio (same round, same load).", ""
puts "| | median | spread (min-max) | vs 1 process | vs C, same threads | CPU us/op | leases /1k | leases /s | lock waits /1k | lease datagrams /1k | fairness (slowest/fastest) | ids ok |",
  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
rows.each do |row|
  s = samples[row.label]
  rates = s.map(&:first)
  c_row = "#{C_LABEL}, #{row.procs} thread#{"s" if row.procs > 1}"
  version = row.label.split(",").first
  one = row.label.start_with?(C_LABEL) ? "#{C_LABEL}, 1 thread" : "#{version}, :#{row.fsync}, 1 process"
  vs_c = (row.fsync == :always && !row.label.start_with?(C_LABEL) && samples.key?(c_row)) ? ratio.call(row.label, c_row) : nil
  per_k = ->(k) { median.call(s.map { |x| x[k] && x[k] * 1000.0 / x[7] }) }
  per_s = median.call(s.map { |x| x[2] && x[0] && x[7] && x[2] * x[0] / x[7] })
  ids = (s.first.size > 6) ? "#{s.count { |x| x[6] == 1 }}/#{s.size}" : "-"
  puts format("| %s | %s ops/s | %s-%s | %sx | %s | %s | %s | %s | %s | %s | %s | %s |", row.label, median.call(rates).round,
    rates.min.round, rates.max.round, fmt.call(ratio.call(row.label, one), "%.2f"), vs_c ? format("%.0f%%", vs_c * 100) : "-",
    fmt.call(median.call(s.map { |x| x[1] })), fmt.call(per_k.call(2)), fmt.call(per_s, "%.0f"), fmt.call(per_k.call(3)),
    fmt.call(per_k.call(4)), fmt.call(median.call(s.map { |x| x[5] }), "%.2f"), ids)
end
puts
workers.each_value { |w| w.io.close }
c_worker&.io&.close
