# frozen_string_literal: true

# Where the Log's cross-process wakeup latency goes. A child process blocks in `store.wait`; the parent
# appends COUNT messages PAUSE apart and stamps each with the wall-clock time before its append. For every
# message: the append's own duration (an IDS reservation makes one slow: it fsyncs the log and writes IDS),
# and the rest of the latency (datagram, the child's listener thread, catching up, the waiter's wake).
#
#   bundle exec ruby bench/log_wakeup_bench.rb            # COUNT=300 PAUSE=0.003
#
# Prints p50/p99/max of the whole latency, of the append and of the rest, how many appends reserved ids,
# the load average, and the latency of the slowest messages with what their append took.
$LOAD_PATH.unshift(ENV["LIB"] || File.expand_path("../lib", __dir__)) # LIB: another checkout, to compare
require "herald"
require "tmpdir"

COUNT = Integer(ENV.fetch("COUNT", "300"))
PAUSE = Float(ENV.fetch("PAUSE", "0.003"))
codec = Herald::Codec::Json

def pct(sorted, p) = sorted[((sorted.size - 1) * p).round]

def summary(name, values)
  s = values.sort
  format("%-32s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms", name, pct(s, 0.5), pct(s, 0.99), s.last)
end

Dir.mktmpdir("herald-wakeup") do |dir|
  load_before = File.read("/proc/loadavg").split.first(3).join(" ")
  r, w = IO.pipe
  pid = fork do
    r.close
    store = Herald::Store::Log.new(dir: dir, fsync: :interval)
    last = store.last_global_id
    w.puts "ready"
    w.flush
    loop do
      last = store.wait(last, timeout: 2)
      w.puts "#{last} #{Process.clock_gettime(Process::CLOCK_REALTIME)}"
      w.flush
    end
  end
  w.close
  r.gets
  # The control: a process that only sleeps PAUSE and measures how late it wakes (the scheduler's delay
  # on this machine at this load). If its p99 matches the wakeup's, the wakeup is as late as any process.
  cr, cw = IO.pipe
  control = fork do
    cr.close
    late = []
    (COUNT + 50).times do
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      sleep PAUSE
      late << (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t - PAUSE) * 1000
    end
    cw.write(late.join(" "))
    cw.close
    exit!(0)
  end
  cw.close
  store = Herald::Store::Log.new(dir: dir, fsync: :interval)
  sent = {}
  took = {}
  reserved = {}
  reservation = store.instance_variable_get(:@reservation)
  COUNT.times do
    sleep PAUSE
    before = reservation.reserved
    t = Process.clock_gettime(Process::CLOCK_REALTIME)
    gid = store.append("/latency", codec.encode(t), codec: codec).global_id
    took[gid] = (Process.clock_gettime(Process::CLOCK_REALTIME) - t) * 1000
    reserved[gid] = reservation.reserved != before
    sent[gid] = t
  end
  latency = {}
  deadline = Time.now + 10
  while latency.size < sent.size && Time.now < deadline && (line = r.gets)
    gid, woke = line.split
    sent.each_key { |k| latency[k] ||= (woke.to_f - sent[k]) * 1000 if k <= gid.to_i }
  end
  Process.kill(:KILL, pid)
  Process.wait(pid)
  control_late = cr.read.split.map(&:to_f)
  Process.wait(control)
  store.close
  ids = latency.keys
  puts "#{ids.size} messages #{PAUSE * 1000} ms apart; load average #{load_before} before, #{File.read("/proc/loadavg").split.first(3).join(" ")} after"
  puts summary("publish -> wakeup (whole)", ids.map { |k| latency[k] })
  puts summary("the append itself", ids.map { |k| took[k] })
  puts summary("the rest (after the append)", ids.map { |k| latency[k] - took[k] })
  puts summary("control: a sleep's lateness", control_late)
  puts "appends that reserved ids (IDS written, log fsynced first): #{reserved.count { |_, v| v }}: #{reserved.select { |_, v| v }.keys.map { |k| format("id %d took %.2f ms", k, took[k]) }.join(", ")}"
  slow = ids.select { |k| latency[k] > 5 }.sort
  stalls = slow.slice_when { |a, b| b != a + 1 }.to_a
  puts "over 5 ms: #{slow.size} messages in #{stalls.size} stall(s) of consecutive messages (one stall of the reader delays every message sent during it)#{" (the first message's append reserved ids)" if slow.include?(ids.min)}"
  puts "slowest 5: " + ids.max_by(5) { |k| latency[k] }.map { |k| format("id %d %.2f ms (append %.2f)", k, latency[k], took[k]) }.join(", ")
end
