# frozen_string_literal: true

require_relative "../../test_helper"
require_relative "thread_runs"

# fsync: :always from several threads of one process (Log::GroupCommit): how batches form and how a
# finished batch's appenders are woken. The disk is made slow and steady (a sleep in place of each
# segment's fdatasync, which like fdatasync gives up the GVL), so that what is counted is the store's own
# doing, not this machine's disk.
class LogGroupCommitTest < Minitest::Test
  include LogThreadRuns

  THREADS = 8
  SYNC = 0.003 # seconds a "disk" sync takes here

  # Stands in for the disk in these tests: a sync that takes SYNC seconds. While LEADERS is open, each
  # sync tells it which thread is syncing.
  module SlowSync
    LEADERS = Queue.new

    def sync
      LEADERS << Thread.current unless LEADERS.closed?
      sleep(SYNC)
    end
  end

  def setup
    @dir = Dir.mktmpdir("herald-group-commit")
    @store = Herald::Store::Log.new(dir: @dir, fsync: :always, max_backlog_size: 100_000)
    @store.append("/warm", json_codec.encode("first"), codec: json_codec) # reserves ids, opens the segment
    @store.instance_variable_get(:@segments).last.singleton_class.prepend(SlowSync)
    @batches = []
    batches = @batches
    @store.singleton_class.prepend(Module.new do
      private define_method(:write_batch) { |batch| batches << batch.size and super(batch) }
    end)
  end

  def teardown
    @store&.close
    FileUtils.rm_rf(@dir)
  end

  # Half the threads pause once (a GC, a slow request): meanwhile the other half commit in batches of 4.
  # When the first half come back they queued during a sync, and the next gather used to wait for as many
  # records as the last batch held (4) and go: the two halves then alternated in batches of 4 for good,
  # two fdatasyncs where one would do. The gather now waits for every appender of the last cycle.
  def test_batches_split_by_a_pause_join_again
    per_thread = 40
    append_in_threads(per_thread) { |t, i| sleep 0.03 if t < THREADS / 2 && i == 3 }
    middle = @batches[@batches.size / 3, @batches.size / 3] # after the pause, before the first half finishes
    median = middle.sort[middle.size / 2]
    assert_operator median, :>=, 7, "records per batch in the middle third of the run: #{middle.inspect} of #{@batches.inspect}"
    assert_dense(per_thread)
  end

  # A finished batch's appenders used to be woken all at once: each found the GVL taken and slept again
  # in Ruby's GVL queue until woken a second time (three context switches a record with 8 threads). They
  # are now woken one after another, each by the one before as it leaves.
  def test_a_finished_batch_wakes_its_appenders_one_at_a_time
    per_thread = 40
    switches = append_in_threads(per_thread) {}
    per_record = switches.sum.fdiv(THREADS * per_thread)
    assert_operator per_record, :<, 2.4, "voluntary context switches per record, per thread: #{switches.inspect}, batches #{@batches.inspect}"
    assert_dense(per_thread)
  end

  # Appenders killed: one while it syncs a batch as its leader, two at random moments (queued, gathering,
  # waiting for their batch, or done but not yet woken). The others are still woken and finish without an
  # error, every record they got back is stored once, and ids stay dense. A leader killed in its sync used
  # to fail its whole batch with StoreError ("may or may not be stored"); the kill now waits until the
  # batch is handed out. SEED= replays the random kill times.
  def test_killed_appenders_leave_nobody_asleep_and_fail_nobody_else
    seed = Integer(ENV.fetch("SEED", Random.new_seed % 100_000))
    rng = Random.new(seed)
    returned = Queue.new
    threads = Array.new(THREADS) do |t|
      Thread.new do
        i = 0
        loop do
          msg = @store.append("/k#{t}", json_codec.encode("é#{i}🎉\0"), codec: json_codec)
          returned << [t, i, msg.global_id]
          i += 1
          break if i == 60
        end
      end
    end
    SlowSync::LEADERS.clear
    10.times { SlowSync::LEADERS.pop }
    leader = SlowSync::LEADERS.pop # syncing a batch now
    SlowSync::LEADERS.close
    leader.kill
    killed = [leader]
    2.times do
      sleep rng.rand(0.002..0.02)
      killed << (threads - killed).sample(random: rng).tap(&:kill)
    end
    survivors = threads - killed
    survivors.each do |th|
      assert th.join(20), "seed #{seed}: an appender never returned (left asleep)"
      th.value # raises what the thread raised
    end
    killed.each { |th| th.join(5) }
    got = Array.new(returned.size) { returned.pop }
    survivors.each { |th| assert_equal 60, got.count { |t, *| threads[t] == th }, "seed #{seed}" }
    @store.close
    @store = Herald::Store::Log.new(dir: @dir, max_backlog_size: 100_000)
    all = @store.global_backlog(0)
    assert_equal (1..all.size).to_a, all.map(&:global_id), "seed #{seed}: dense global ids"
    by_id = all.to_h { |m| [m.global_id, m] }
    got.each { |t, i, id| assert_equal ["/k#{t}", "é#{i}🎉\0"], [by_id.fetch(id).channel, by_id.fetch(id).data], "seed #{seed}" }
    THREADS.times do |t|
      msgs = @store.backlog("/k#{t}", 0)
      assert_equal (1..msgs.size).to_a, msgs.map(&:message_id), "seed #{seed}: dense ids in /k#{t}"
    end
  end

  private

  # Each thread appends per_thread records to a channel of its own, calling the block before each.
  # Returns each thread's voluntary context switches over its loop.
  def append_in_threads(per_thread)
    run_threads(per_thread) do |t, i|
      yield t, i
      @store.append("/t#{t}", json_codec.encode("é#{i}🎉\0"), codec: json_codec)
    end
  end

  # Every record is there once, with dense ids in commit order, also after reopening.
  def assert_dense(per_thread)
    @store.close
    @store = Herald::Store::Log.new(dir: @dir, max_backlog_size: 100_000)
    all = @store.global_backlog(0)
    assert_equal (1..THREADS * per_thread + 1).to_a, all.map(&:global_id)
    THREADS.times do |t|
      msgs = @store.backlog("/t#{t}", 0)
      assert_equal (1..per_thread).to_a, msgs.map(&:message_id)
      assert_equal per_thread.times.map { |i| "é#{i}🎉\0" }, msgs.map(&:data)
    end
  end
end
