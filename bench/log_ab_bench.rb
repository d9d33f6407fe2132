# frozen_string_literal: true

# The Log's publish, this code against another checkout of Herald (OLD_LIB, e.g. the commit before a
# change: `git archive <commit> lib | tar -x -C /tmp/old`), and message_bus's memory backend, each in a
# process of its own (two versions of Herald cannot share one), measured round-robin: one round of
# every row, then the next, so load from other work hits every row alike.
#
#   OLD_LIB=/tmp/old/lib bundle exec ruby bench/log_ab_bench.rb
#
# Without OLD_LIB it compares with BASELINE_COMMIT, Herald's lib when issue 12 ("a leaner log append")
# was filed, taken from this clone's git history (OLD_LIB=none: no comparison).
#
# Rows: Bus#publish of {"hello":"world","nums":[1,2,3]} to a Log with fsync :interval from 1 and 8 threads,
# :always from 1 and 8 threads, and message_bus's memory backend publish (the envelope already encoded, as
# bench/publish_bench.rb does). Prints median ops/s, spread, objects/op and the ratios the targets name.
# Beside them, when cc builds it, the same group commit in C without Ruby's GVL (bench/support/group_commit.c:
# 1 and 8 pthreads, each waiting for a sync that began after its record): what this disk and VM allow
# 8 threads against one (docs/log.md, "8 threads against one, third pass").
require "fileutils"
require "json"
require_relative "support/script_worker"
require "rbconfig"
require "tmpdir"

ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "5"))
SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
NEW_LIB = File.expand_path("../lib", __dir__)
BASELINE_COMMIT = "f57f64d"

OLD_LIB = case ENV["OLD_LIB"]
when "none" then nil
when nil, "" then Bench.commit_lib(BASELINE_COMMIT)
else ENV["OLD_LIB"]
end

WORKER = <<~RUBY
  lib = ARGV[0]
  $LOAD_PATH.unshift(lib) unless lib == "-"
  require "tmpdir"
  require "json"
  require "fiddle"
  data = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
  # Context switches of the whole process, threads that ended included: getrusage(RUSAGE_SELF)'s
  # ru_nvcsw and ru_nivcsw (Linux x86-64 layout: two timevals, then 14 longs).
  getrusage = Fiddle::Function.new(Fiddle.dlopen(nil)["getrusage"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)
  rusage = ([0] * 18).pack("q*")
  switches = -> {
    getrusage.call(0, rusage)
    rusage.unpack("q<q<", offset: 128)
  }
  threaded = ->(threads, n, &b) { Array.new(threads) { Thread.new { (n / threads).times(&b) } }.each(&:join) }
  dir = Dir.mktmpdir("herald-ab")
  STATS = Hash.new(0)
  cases = if lib == "-"
    require "message_bus"
    mb = MessageBus::Instance.new
    mb.configure(backend: :memory)
    backend = mb.backend_instance
    envelope = JSON.dump("data" => data, "user_ids" => nil, "group_ids" => nil, "client_ids" => nil)
    {"memory" => ->(n) { n.times { backend.publish("/test/channel", envelope) } }}
  else
    $VERBOSE = nil # the bundle's gemspec loaded this checkout's Herald::VERSION; another lib redefines it
    require "herald"
    # Counted inside the store, where these methods exist (not in every OLD_LIB): fdatasync calls and
    # the time in them, and for :always's group commit the staging and write of each batch and the gap
    # between the end of a sync and the start of the next batch's write (the hand-offs and the gather).
    log = Herald::Store::Log
    count = ->(mod, name, key) {
      return unless mod.method_defined?(name) || mod.private_method_defined?(name)
      mod.prepend(Module.new do
        define_method(name) do |*args|
          t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          super(*args)
        ensure
          STATS[key] += Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
          STATS[key.to_s + "_n"] += 1
        end
        private name if mod.private_method_defined?(name)
      end)
    }
    count.call(log::Segment, :sync, "sync")
    count.call(log, :write_batch, "write")
    if log.private_method_defined?(:write_batch)
      log::Segment.prepend(Module.new { define_method(:sync) { super().tap { STATS["synced_at"] = Process.clock_gettime(Process::CLOCK_MONOTONIC) } } })
      log.prepend(Module.new do
        define_method(:write_batch) do |batch|
          if (synced_at = STATS["synced_at"]).is_a?(Float)
            STATS["gap"] += Process.clock_gettime(Process::CLOCK_MONOTONIC) - synced_at
            STATS["gap_n"] += 1
          end
          super(batch)
        end
        private :write_batch
      end)
    end
    interval = Herald::Bus.new(store: Herald::Store::Log.new(dir: File.join(dir, "i"), fsync: :interval))
    always = Herald::Bus.new(store: Herald::Store::Log.new(dir: File.join(dir, "a"), fsync: :always))
    {"interval1" => ->(n) { n.times { interval.publish("/test/channel", data) } },
     "interval8" => ->(n) { threaded.call(8, n) { interval.publish("/test/channel", data) } },
     "always1" => ->(n) { n.times { always.publish("/test/channel", data) } },
     "always8" => ->(n) { threaded.call(8, n) { always.publish("/test/channel", data) } }}
  end
  $stdout.sync = true
  puts "ready"
  while (line = $stdin.gets)
    name, n = line.split
    run = cases.fetch(name)
    n = Integer(n)
    GC.start
    STATS.clear
    vcs, ics = switches.call
    objects = GC.stat(:total_allocated_objects)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    run.call(n)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    vcs2, ics2 = switches.call
    per = ->(key) { STATS[key + "_n"].zero? ? nil : STATS[key] * 1e6 / STATS[key + "_n"] }
    puts JSON.generate([n / t, (GC.stat(:total_allocated_objects) - objects).fdiv(n), cpu * 1e6 / n,
      STATS["sync_n"].fdiv(n), per.call("sync"), per.call("gap"), per.call("write"), STATS["write_n"].zero? ? nil : n.fdiv(STATS["write_n"]),
      (vcs2 - vcs).fdiv(n), (ics2 - ics).fdiv(n)])
  end
RUBY

def spawn_worker(lib) = Bench::ScriptWorker.spawn(WORKER, lib)

# The C group commit as a worker (answers "THREADS RECORDS" with the Ruby worker's columns), or nil when cc
# cannot build it.
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

workers = {"new" => spawn_worker(NEW_LIB), "message_bus" => spawn_worker("-")}
workers["old"] = spawn_worker(OLD_LIB) if OLD_LIB
(c = spawn_c_worker) and workers["c"] = c
ops = ->(n) { [(n * SCALE).to_i, 8].max }
rows = [["message_bus memory backend publish", "message_bus", "memory", ops.call(20_000)]]
%w[old new].each do |v|
  next unless workers[v]
  label = (v == "old") ? "Herald Log (OLD_LIB)" : "Herald Log (this code)"
  rows << ["#{label} :interval, 1 thread", v, "interval1", ops.call(20_000)]
  rows << ["#{label} :interval, 8 threads", v, "interval8", ops.call(20_000)]
  rows << ["#{label} :always, 1 thread", v, "always1", ops.call(300)]
  rows << ["#{label} :always, 8 threads", v, "always8", ops.call(2_000)]
end
C_LABEL = "C group commit without the GVL (bench/support/group_commit.c)"
if workers["c"]
  rows << ["#{C_LABEL}, 1 thread", "c", "1", ops.call(300)]
  rows << ["#{C_LABEL}, 8 threads", "c", "8", ops.call(2_000)]
end
load_before = File.read("/proc/loadavg").split.first(3).join(" ")
rows.each { |_, w, name, n| workers[w].run(name, [n / 10, 8].max) } # warm-up
samples = Hash.new { |h, k| h[k] = [] }
ROUNDS.times do
  rows.each { |label, w, name, n| samples[label] << workers[w].run(name, n) }
end
load_after = File.read("/proc/loadavg").split.first(3).join(" ")
median = ->(a) {
  s = a.sort
  s.size.odd? ? s[s.size / 2] : (s[s.size / 2 - 1] + s[s.size / 2]) / 2.0
}
rate = rows.to_h { |label, *| [label, median.call(samples[label].map(&:first))] }
puts "### Log publish, this code vs OLD_LIB#{" (#{OLD_LIB})" if OLD_LIB} vs message_bus memory", ""
puts "Each in its own process, rows round-robin, #{ROUNDS} rounds. Load average #{load_before} before, #{load_after} after (2 cores shared with other work).", ""
puts "CPU us/op: the worker process's CPU time (every thread) per publish, median over rounds: less sensitive to load than the rate.", ""
puts "| | median | spread (min-max) | CPU us/op | objects/op | context switches/op (voluntary + involuntary) |", "|---|---:|---:|---:|---:|---:|"
rows.each do |label, *|
  rates = samples[label].map(&:first)
  puts format("| %s | %s ops/s | %s-%s | %.2f | %.1f | %.2f + %.2f |", label, rate[label].round.to_s, rates.min.round.to_s, rates.max.round.to_s,
    median.call(samples[label].map { |x| x[2] }), median.call(samples[label].map { |x| x[1] }),
    median.call(samples[label].map { |x| x[8] }), median.call(samples[label].map { |x| x[9] }))
end
puts
puts "fsync :always inside the store, medians over rounds (where OLD_LIB has the same methods): fdatasync calls per publish, records " \
  "per batch, and per batch the time in fdatasync, from the end of the last sync to this batch's write (the hand-offs and the gather), " \
  "and in its staging and write (wall clock, us).", ""
puts "| | fdatasync/publish | records/batch | sync us | sync to next write us | staging+write us |", "|---|---:|---:|---:|---:|---:|"
show = ->(v) { v ? format("%.1f", v) : "-" }
rows.each do |label, w, name|
  next unless name.start_with?("always") || w == "c"
  col = ->(i) { (v = samples[label].map { |x| x[i] }.compact).empty? ? nil : median.call(v) }
  puts format("| %s | %.3f | %s | %s | %s | %s |", label, col.call(3), show.call(col.call(7) || (1 / col.call(3) if col.call(3)&.positive?)),
    show.call(col.call(4)), show.call(col.call(5)), show.call(col.call(6)))
end
puts
ratio = ->(a, b) { format("%.2fx", rate.fetch(a) / rate.fetch(b)) }
now = "Herald Log (this code)"
puts "- :interval 1 thread vs message_bus memory: #{ratio.call("#{now} :interval, 1 thread", "message_bus memory backend publish")}"
puts "- :interval 1 thread vs OLD_LIB: #{ratio.call("#{now} :interval, 1 thread", "Herald Log (OLD_LIB) :interval, 1 thread")}" if OLD_LIB
puts "- :interval 8 threads vs 1 thread: #{ratio.call("#{now} :interval, 8 threads", "#{now} :interval, 1 thread")}"
puts "- :always 8 threads vs 1 thread: #{ratio.call("#{now} :always, 8 threads", "#{now} :always, 1 thread")}"
if OLD_LIB
  old = "Herald Log (OLD_LIB)"
  puts "- OLD_LIB: :interval 1 thread vs message_bus memory #{ratio.call("#{old} :interval, 1 thread", "message_bus memory backend publish")}, " \
    ":interval 8 threads vs 1 #{ratio.call("#{old} :interval, 8 threads", "#{old} :interval, 1 thread")}, " \
    ":always 8 threads vs 1 #{ratio.call("#{old} :always, 8 threads", "#{old} :always, 1 thread")}"
end
if workers["c"]
  puts "- the C group commit without the GVL, 8 threads vs 1: #{ratio.call("#{C_LABEL}, 8 threads", "#{C_LABEL}, 1 thread")} " \
    "(this disk's ceiling for threads sharing syncs); Herald :always 8 threads vs the C 8 threads: " \
    "#{ratio.call("#{now} :always, 8 threads", "#{C_LABEL}, 8 threads")}"
end
workers.each_value { |w| w.io.close }
