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
  # One record exactly as the log stores it (frame + header + channel + data), decoded from its read buffer.
  record = Herald::Store::Log::Record.encode(String.new(encoding: Encoding::BINARY), 1001, 1001, CHANNEL, nil,
    Herald::Codec::Json.encode(DATA), Herald::Codec::Json.id, Time.now.to_f, nil, nil, nil).dup
  length = Herald::Store::Log::Record.check(record, 0, record.bytesize)
  Bench.section("Decode one stored record into a message",
    note: "message_bus: `MessageBus::Message.decode` of its pipe-delimited string. Herald: a log record into a Herald::Message: one unpack of its ids, the rest sliced from the buffer on first access (second row: channel and payload read too); data stays encoded until read.") do |s|
    s.measure("MessageBus::Message.decode", ops: 200_000, baseline: true) { |n| n.times { MessageBus::Message.decode(encoded) } }
    s.measure("Herald Log record decode", ops: 200_000) { |n| n.times { Herald::Store::Log::Record.decode(record, 0, length) } }
    s.measure("Herald Log record decode + read channel and payload", ops: 200_000) do |n|
      n.times do
        m = Herald::Store::Log::Record.decode(record, 0, length)
        m.channel
        m.payload
      end
    end
  end
ensure
  mb&.destroy
  log&.close
end
