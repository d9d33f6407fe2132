# frozen_string_literal: true

# backlog of the last 100 messages of a 1,000-message channel, and decoding one stored record into a message.
require_relative "harness"
require_relative "support/peers"
require "herald"
require "tmpdir"

DATA = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
CHANNEL = "/test/channel"

Dir.mktmpdir("herald-bench") do |tmp|
  mb = Bench.message_bus_memory
  log = Herald::Bus.new(store: Herald::Store::Log.new(dir: tmp, fsync: :never))
  memory = Herald::Bus.new(store: Herald::Store::Memory.new)
  1000.times do
    mb.publish(CHANNEL, DATA)
    log.publish(CHANNEL, DATA)
    memory.publish(CHANNEL, DATA)
  end

  Bench.section("backlog(100) of a 1,000-message channel",
    note: "message_bus backend `backlog` returns messages with the encoded envelope; MessageBus#backlog also decodes it. Herald decodes data lazily.") do |s|
    s.measure("message_bus memory backend backlog", ops: 2000, baseline: true) { |n| n.times { mb.backend_instance.backlog(CHANNEL, 900) } }
    s.measure("message_bus MessageBus#backlog (memory)", ops: 2000) { |n| n.times { mb.backlog(CHANNEL, 900) } }
    s.measure("Herald Log backlog", ops: 2000) { |n| n.times { log.backlog(CHANNEL, 900) } }
    s.measure("Herald Memory backlog", ops: 2000) { |n| n.times { memory.backlog(CHANNEL, 900) } }
  end

  encoded = MessageBus::Message.new(1001, 1001, CHANNEL, JSON.dump("data" => DATA, "user_ids" => nil)).encode
  record = Herald::Store::Log::Record.encode_sample(CHANNEL, Herald::Codec::Json.encode(DATA))
  Bench.section("Decode one stored record into a message",
    note: "message_bus: `MessageBus::Message.decode` of its pipe-delimited string. Herald: the log record's frame (ids, channel, targets, payload) into a Herald::Message; data stays encoded until read.") do |s|
    s.measure("MessageBus::Message.decode", ops: 200_000, baseline: true) { |n| n.times { MessageBus::Message.decode(encoded) } }
    s.measure("Herald Log record decode", ops: 200_000) { |n| n.times { Herald::Store::Log::Record.decode_sample(record) } }
  end
ensure
  mb&.destroy
  log&.close
end
