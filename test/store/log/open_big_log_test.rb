# frozen_string_literal: true

require_relative "../../test_helper"

# Opening a big log (issue 23, defect 8). Reading every record of a 500,000-record log took 4.3 s, all of
# it under the write lock: other processes' publishes stalled as long, and of 6 processes opening a
# 900k-record log at once with lock_timeout: 1, 5 raised TimeoutError naming the opener "a stopped or hung
# process" (a Puma cluster booting its workers is neither). Sealed segments are now read without the lock.
class LogOpenBigLogTest < Minitest::Test
  RECORDS = Integer(ENV.fetch("BIG_LOG_RECORDS", "300000"))
  SEGMENT_BYTES = 4 * 1024 * 1024
  CHANNELS = 10
  OPENERS = 4 # a Puma cluster booting its workers

  def setup
    @dir = Dir.mktmpdir("herald-big")
    build_log
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # One process publishes in a loop (lock_timeout: 1) while another opens the log: no TimeoutError, and
  # its longest publish is a small part of the open.
  def test_opening_a_big_log_does_not_stall_another_process_publishing
    report_r, report_w = IO.pipe
    ready_r, ready_w = IO.pipe
    stop_r, stop_w = IO.pipe
    pid = fork do
      [report_r, ready_r, stop_w].each(&:close)
      report_w.write(Marshal.dump(publish_until(stop_r, ready_w)))
      exit!(0)
    end
    [report_w, ready_w, stop_r].each(&:close)
    assert_equal "R", ready_r.read(1), "the publisher opened the log"
    sleep 0.3
    started = monotonic
    store = Herald::Store::Log.new(dir: @dir, lock_timeout: 1)
    opened = monotonic - started
    assert_operator store.last_global_id, :>=, RECORDS
    store.close
    sleep 0.3
    stop_w.write("S")
    stop_w.close
    report = Marshal.load(report_r.read) # standard:disable Security/MarshalLoad
    Process.wait(pid)
    puts format("\n  open of %d records: %.0f ms; the other process meanwhile: %d publishes, longest %.1f ms, errors %p",
      RECORDS, opened * 1000, report[:count], report[:max] * 1000, report[:errors])
    assert_empty report[:errors]
    assert_operator report[:count], :>, 0
    assert_operator report[:max], :<, opened * 0.25, "the publisher's longest stall is a small part of the open"
  end

  # A cluster booting: several processes open the log at once, each with lock_timeout: 1.
  def test_four_processes_opening_a_big_log_at_once_all_succeed
    started = monotonic
    pids = OPENERS.times.map do
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        result = begin
          store = Herald::Store::Log.new(dir: @dir, lock_timeout: 1)
          last = store.last_global_id
          store.close
          last
        rescue Herald::Error => e
          "#{e.class}: #{e.message}"
        end
        writer.write(Marshal.dump(result))
        exit!(0)
      end
      writer.close
      [pid, reader]
    end
    results = pids.map do |pid, reader|
      Marshal.load(reader.read).tap { Process.wait(pid) } # standard:disable Security/MarshalLoad
    end
    puts format("\n  %d processes opened %d records at once in %.0f ms: %p", OPENERS, RECORDS, (monotonic - started) * 1000, results.tally)
    assert_equal [RECORDS] * OPENERS, results
  end

  private

  # Opens the log, says so, and publishes until told to stop; returns the longest publish and any error.
  def publish_until(stop, ready)
    store = Herald::Store::Log.new(dir: @dir, lock_timeout: 1)
    ready.write("R")
    codec = Herald::Codec.fetch(:json)
    report = {count: 0, max: 0.0, errors: []}
    until stop.wait_readable(0.002)
      started = monotonic
      begin
        store.append("/live", "1", codec: codec)
        report[:count] += 1
      rescue Herald::Error => e
        report[:errors] << "#{e.class}: #{e.message}"
      end
      took = monotonic - started
      report[:max] = took if took > report[:max]
    end
    store.close
    report
  end

  # RECORDS small records written as segment files directly (the store's own encoder, in a second or two
  # where publishing them would take half a minute on a loaded machine), then META and IDS as a clean close
  # leaves them.
  def build_log
    buffer = String.new(encoding: Encoding::BINARY)
    segment = String.new(encoding: Encoding::BINARY)
    first = 1
    ids = Hash.new(0)
    at = Process.clock_gettime(Process::CLOCK_REALTIME)
    (1..RECORDS).each do |gid|
      channel = "/c#{gid % CHANNELS}"
      Herald::Store::Log::Record.encode(buffer, gid, ids[channel] += 1, channel, nil, gid.to_s, Herald::Codec.fetch(:json).id, at, nil, nil, nil)
      segment << buffer
      next unless segment.bytesize >= SEGMENT_BYTES || gid == RECORDS
      File.binwrite(File.join(@dir, Herald::Store::Log::Segment.file_name(first)), segment)
      segment.clear
      first = gid + 1
    end
    File.write(File.join(@dir, "META"), JSON.generate({"format" => 1, "epoch" => "bigbigbig", "segment_bytes" => SEGMENT_BYTES}))
    File.write(File.join(@dir, "IDS"), JSON.generate({"reserved" => RECORDS, "floor" => 0}))
  end

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
