# frozen_string_literal: true

require_relative "../../test_helper"
require_relative "thread_runs"

# Several threads of one process publishing into one log: what they cost each other under Ruby's GVL.
class LogThreadsTest < Minitest::Test
  include LogThreadRuns

  THREADS = 4

  def setup
    @dir = Dir.mktmpdir("herald-threads")
  end

  def teardown
    @store&.close
    FileUtils.rm_rf(@dir)
  end

  # Ruby's pwrite hands the GVL to another thread for the syscall and queues for it again: with several
  # publishing threads, every record cost its writer a sleep and a wakeup (a voluntary context switch)
  # and the others a condition-variable round trip. The write keeps the GVL now (Segment#write).
  def test_threads_publishing_with_fsync_interval_do_not_hand_the_gvl_around_per_record
    @store = Herald::Store::Log.new(dir: @dir, fsync: :interval, max_backlog_size: 10_000)
    per_thread = 1500
    switches = run_threads(per_thread) { |t, i| @store.append("/t#{t}", json_codec.encode("é#{i}🎉\0"), codec: json_codec) }
    per_record = switches.sum.fdiv(THREADS * per_thread)
    assert_operator per_record, :<, 0.25, "voluntary context switches per record, per thread: #{switches.inspect}"
    assert_dense
  end

  private

  # Every record is there once, with dense ids, globally and per channel, also after reopening.
  def assert_dense
    @store.close
    @store = Herald::Store::Log.new(dir: @dir, max_backlog_size: 10_000)
    all = @store.global_backlog(0)
    assert_equal (1..all.size).to_a, all.map(&:global_id)
    THREADS.times do |t|
      msgs = @store.backlog("/t#{t}", 0)
      assert_equal (1..msgs.size).to_a, msgs.map(&:message_id)
      assert_equal msgs.size.times.map { |i| "é#{i}🎉\0" }, msgs.map(&:data)
    end
  end
end
