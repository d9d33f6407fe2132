# frozen_string_literal: true

# Publish of {"hello":"world","nums":[1,2,3]} on /test/channel: Herald's stores against the message_bus
# gem's memory backend and a Rage-style CRC line log, in one run.
require_relative "harness"
require_relative "support/peers"
require "herald"
require "tmpdir"

DATA = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
CHANNEL = "/test/channel"
N = 20_000

def herald_bus(store) = Herald::Bus.new(store: store)

def log_bus(dir, fsync) = herald_bus(Herald::Store::Log.new(dir: dir, fsync: fsync))

def threaded(threads, n)
  per = n / threads
  threads.times.map { Thread.new { per.times { yield } } }.each(&:join)
end

Dir.mktmpdir("herald-bench") do |tmp|
  mb = Bench.message_bus_memory
  mb_backend = mb.backend_instance
  envelope = JSON.dump("data" => DATA, "user_ids" => nil, "group_ids" => nil, "client_ids" => nil)
  rage = Bench::RageStyleLog.new(File.join(tmp, "rage.log"))
  interval = log_bus(File.join(tmp, "interval"), :interval)
  memory = herald_bus(Herald::Store::Memory.new)

  Bench.section("Publish (fsync :interval or none)",
    note: "One thread. message_bus backend `publish` gets the already-encoded envelope; the other rows encode the data too. " \
      "The Rage-style log writes into Ruby's own IO buffer (a syscall every ~8 KB; kill -9 loses the buffer); Herald's log " \
      "hands every record to the OS before publish returns (one pwrite a publish while it keeps the write lock: docs/log.md).") do |s|
    s.measure("message_bus memory backend publish", ops: N, baseline: true) { |n| n.times { mb_backend.publish(CHANNEL, envelope) } }
    s.measure("message_bus MessageBus#publish (memory)", ops: N) { |n| n.times { mb.publish(CHANNEL, DATA) } }
    s.measure("Rage-style append (Marshal + CRC32 hex line)", ops: N) { |n| n.times { rage.add(DATA) } }
    s.measure("Herald Log fsync :interval", ops: N) { |n| n.times { interval.publish(CHANNEL, DATA) } }
    s.measure("Herald Memory", ops: N) { |n| n.times { memory.publish(CHANNEL, DATA) } }
  end

  always = log_bus(File.join(tmp, "always"), :always)
  Bench.section("Publish with fsync :always (group commit)",
    note: "Durable before publish returns. Baseline: one thread, one fsync per publish. Each publisher blocks until its " \
      "record is synced, so N publishers can share at most N records per fsync: N x the baseline is the ceiling (8x for 8 threads).") do |s|
    s.measure("Herald Log :always, 1 thread", ops: 1000, baseline: true, rounds: 5) { |n| n.times { always.publish(CHANNEL, DATA) } }
    s.measure("Herald Log :always, 8 threads", ops: 4000, rounds: 5) { |n| threaded(8, n) { always.publish(CHANNEL, DATA) } }
    s.measure("Herald Log :always, 32 threads", ops: 6000, rounds: 3) { |n| threaded(32, n) { always.publish(CHANNEL, DATA) } }
  end
ensure
  [mb, interval, always, memory].each { |b| b&.destroy rescue b&.close } # standard:disable Style/RescueModifier
  rage&.close
end
