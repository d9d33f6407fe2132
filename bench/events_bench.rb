# frozen_string_literal: true

# Deferred events end to end (published to handled): Herald's durable subscriber on the Log store
# (fsync :interval) against a Rage-style task log that writes an `add` and a `rem` line per event
# (Marshal + CRC32 + line, as in Rage's disk backend), both calling the same handler.
require_relative "harness"
require_relative "support/peers"
require "herald"
require "tmpdir"

N = 100_000

UserRegistered = Struct.new(:user_id, :email, keyword_init: true)

# The handler both sides call: counts what it was given.
class Tally
  attr_reader :count

  def initialize = @count = 0

  def call(event) = @count += 1
end
TALLY = Tally.new

class CountEvents
  include Herald::Subscriber

  subscribe_to UserRegistered
  deferred

  def call(event, _message) = TALLY.call(event)
end

EVENT = UserRegistered.new(user_id: 42, email: "ada@example.com")

Dir.mktmpdir("herald-events-bench") do |tmp|
  rage = Bench::RageStyleLog.new(File.join(tmp, "rage.log"))
  raw = nil
  store = Herald::Store::Log.new(dir: File.join(tmp, "log"), fsync: :interval)
  Herald.configure { |c| c.store = store }
  Herald.start_workers

  Bench.section("Deferred events, published to handled (#{Bench.humanize((N * Bench::SCALE).to_i)} events a round)",
    note: "One publishing thread. Rage-style: `add` line, handler, `rem` line, all inline on the publishing thread (no " \
      "handoff: the most favourable way to run the peer). Herald: `Herald.publish_event` appends to the Log store (fsync " \
      ":interval), one deferred subscriber's worker thread reads it in batches and saves its cursor; the clock stops " \
      "when the handler has seen the last event. Objects/op count every thread's allocations.") do |s|
    s.measure("Rage-style log: add + handler + rem", ops: N, baseline: true) do |n|
      n.times do
        id = rage.add(EVENT)
        TALLY.call(EVENT)
        rage.remove(id)
      end
    end
    s.measure("Herald publish_event + deferred subscriber (Log, :interval)", ops: N) do |n|
      target = TALLY.count + n
      n.times { Herald.publish_event(EVENT) }
      sleep 0.0005 until TALLY.count >= target
    end
    # Not a contender: the store's own append rate is the ceiling of the row above (one append per event).
    payload = Herald::Codec::Event.encode(EVENT)
    raw = Herald::Store::Log.new(dir: File.join(tmp, "raw"), fsync: :interval)
    s.measure("(for reference) Herald Store::Log append alone, no subscriber", ops: N) do |n|
      n.times { raw.append("/events/user_registered", payload, codec: Herald::Codec::Event) }
    end
  end
ensure
  Herald.shutdown(timeout: 5)
  Herald.reset!
  rage&.close
  raw&.close
end
