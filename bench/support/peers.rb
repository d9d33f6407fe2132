# frozen_string_literal: true

require "zlib"
require "message_bus"

module Bench
  # The message_bus gem with its in-memory backend, as an app configures it.
  def self.message_bus_memory(max_backlog_size: 1000)
    bus = MessageBus::Instance.new
    bus.configure(backend: :memory)
    bus.backend_instance.max_backlog_size = max_backlog_size
    bus
  end

  # A Rage-style append-only task log, written for this benchmark from the description of Rage's disk
  # backend: each entry is one line "crc32hex:add:<task id>:<publish_at>:<Marshal.dump(task).dump>\n"
  # (and "crc32hex:rem:<task id>\n" when the task is done), written through Ruby's buffered File#write,
  # with an fsync from a background timer every `fsync_interval` seconds.
  class RageStyleLog
    def initialize(path, fsync_interval: 0.1)
      @file = File.open(path, "ab")
      @file.flock(File::LOCK_EX)
      @id_base = "#{Time.now.to_i}-#{Process.pid}"
      @seq = 0
      @dirty = false
      @fsync = Thread.new do
        loop do
          sleep fsync_interval
          next unless @dirty
          @dirty = false
          @file.fsync
        end
      end
    end

    def add(task)
      id = "#{@id_base}-#{@seq += 1}"
      entry = "add:#{id}:0:#{Marshal.dump(task).dump}"
      write("#{Zlib.crc32(entry).to_s(16).rjust(8, "0")}:#{entry}\n")
      id
    end

    def remove(id)
      entry = "rem:#{id}"
      write("#{Zlib.crc32(entry).to_s(16).rjust(8, "0")}:#{entry}\n")
    end

    def close
      @fsync.kill
      @file.close
    end

    private

    def write(line)
      @file.write(line)
      @dirty = true
    end
  end
end
