# frozen_string_literal: true

require_relative "../../test_helper"
require "digest"

# kill -9 at a random moment while a child publishes with fsync: :always: every id the child got back is
# readable afterwards with its data, ids strictly increase, nothing is duplicated.
class LogCrashTest < Minitest::Test
  TRIALS = 20

  def test_sigkill_loses_no_returned_message
    TRIALS.times { |trial| crash_trial(trial, :always) }
  end

  # A process crash leaves the page cache alone: even without fsync nothing returned is lost.
  def test_sigkill_loses_no_returned_message_with_fsync_interval
    5.times { |trial| crash_trial(100 + trial, :interval) }
  end

  private

  def crash_trial(trial, fsync)
    dir = Dir.mktmpdir("herald-crash")
    acked = run_and_kill(dir, Random.new(trial), fsync)
    store = nil
    capture_io { store = Herald::Store::Log.new(dir: dir, fsync: :always, max_backlog_size: 1_000_000) }
    found = store.global_backlog(0)
    ids = found.map(&:global_id)
    assert_equal ids.uniq.sort, ids, "trial #{trial}: ids strictly increase, no duplicates"
    by_id = found.to_h { |m| [m.global_id, m] }
    acked.each do |id, digest|
      msg = by_id[id] or flunk "trial #{trial}: acknowledged id #{id} lost (dir kept: #{dir})"
      assert_equal digest, Digest::SHA256.hexdigest(msg.data), "trial #{trial}: data of id #{id}"
    end
    next_id = store.append("/c", json_codec.encode("after"), codec: json_codec).global_id
    assert_operator next_id, :>, (ids.last || 0)
    store.close
    FileUtils.rm_rf(dir)
  end

  def run_and_kill(dir, rng, fsync)
    r, w = IO.pipe
    pid = fork do
      r.close
      w.sync = true
      store = Herald::Store::Log.new(dir: dir, fsync: fsync, max_backlog_size: 1_000_000, segment_bytes: 256 * 1024)
      loop do
        data = Random.bytes(rand(16..2048)).unpack1("H*")
        msg = store.append("/c", json_codec.encode(data), codec: json_codec)
        w.puts "#{msg.global_id}\t#{Digest::SHA256.hexdigest(data)}" # acknowledged only after append returned
      end
    end
    w.close
    sleep rng.rand(0.05..0.3)
    Process.kill(:KILL, pid)
    Process.wait(pid)
    lines = r.read.lines.select { |l| l.end_with?("\n") }
    r.close
    lines.map { |l| l.chomp.split("\t").then { |id, digest| [Integer(id), digest] } }
  end
end
