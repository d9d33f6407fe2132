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
require "json"
require "rbconfig"
require "tmpdir"

ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "5"))
SCALE = Float(ENV.fetch("BENCH_SCALE", "1"))
NEW_LIB = File.expand_path("../lib", __dir__)
BASELINE_COMMIT = "f57f64d"

# The lib of BASELINE_COMMIT in a temporary directory, or nil when git or the commit is not there.
def baseline_lib
  dir = File.join(Dir.tmpdir, "herald-lib-#{BASELINE_COMMIT}")
  return File.join(dir, "lib") if File.directory?(File.join(dir, "lib"))
  Dir.mkdir(dir) unless File.directory?(dir)
  ok = system("git -C #{File.expand_path("..", __dir__)} archive #{BASELINE_COMMIT} lib | tar -x -C #{dir}", err: File::NULL)
  File.join(dir, "lib") if ok && File.directory?(File.join(dir, "lib"))
end

OLD_LIB = case ENV["OLD_LIB"]
when "none" then nil
when nil, "" then baseline_lib
else ENV["OLD_LIB"]
end

WORKER = <<~RUBY
  lib = ARGV[0]
  $LOAD_PATH.unshift(lib) unless lib == "-"
  require "tmpdir"
  require "json"
  data = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
  threaded = ->(threads, n, &b) { Array.new(threads) { Thread.new { (n / threads).times(&b) } }.each(&:join) }
  dir = Dir.mktmpdir("herald-ab")
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
    objects = GC.stat(:total_allocated_objects)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    run.call(n)
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
    puts JSON.generate([n / t, (GC.stat(:total_allocated_objects) - objects).fdiv(n), cpu * 1e6 / n])
  end
RUBY

Worker = Struct.new(:io) do
  def run(name, n)
    io.puts "#{name} #{n}"
    JSON.parse(io.gets)
  end
end

def spawn_worker(lib)
  io = IO.popen([RbConfig.ruby, "-e", WORKER, lib], "r+")
  raise "worker for #{lib} did not start" unless io.gets == "ready\n"
  Worker.new(io)
end

workers = {"new" => spawn_worker(NEW_LIB), "message_bus" => spawn_worker("-")}
workers["old"] = spawn_worker(OLD_LIB) if OLD_LIB
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
puts "| | median | spread (min-max) | CPU us/op | objects/op |", "|---|---:|---:|---:|---:|"
rows.each do |label, *|
  rates = samples[label].map(&:first)
  puts format("| %s | %s ops/s | %s-%s | %.2f | %.1f |", label, rate[label].round.to_s, rates.min.round.to_s, rates.max.round.to_s,
    median.call(samples[label].map { |x| x[2] }), median.call(samples[label].map { |x| x[1] }))
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
workers.each_value { |w| w.io.close }
