# frozen_string_literal: true

require_relative "../../test_helper"

# fsync: :always promises that `append` (and so `Bus#publish`) returns only once its own record is
# durable: an fdatasync that started after the record was written has returned. Group commit shares one
# sync among concurrent appenders, so a change to who waits for what (the batch hand-out, the gather, the
# take-over) could let a record's appender go before the sync that covers it. This test watches every
# segment's writes and syncs (a real fdatasync, made slower by a sleep so that an early return has room to
# show) and checks, at the moment each append returns, that the bytes of its record were covered by a
# finished sync. Segments roll often (small segment_bytes) so records of a batch landing in a new segment
# are covered too.
class LogDurableReturnTest < Minitest::Test
  THREADS = 8
  PER_THREAD = 60

  # Wraps one segment: what its finished syncs cover (the segment's size when the sync began).
  module WatchedSync
    attr_reader :synced_to

    def sync
      covered = size # everything written before the sync starts is what it makes durable
      sleep 0.001
      super
      @synced_to = covered if covered > (@synced_to || 0)
      SYNCS << covered
    end
  end

  SYNCS = Queue.new

  def setup
    SYNCS.clear
    @dir = Dir.mktmpdir("herald-durable-return")
    @store = Herald::Store::Log.new(dir: @dir, fsync: :always, segment_bytes: 4096, max_backlog_size: 100_000)
    @ends = {} # global id => [segment, the segment's size once the batch holding it was written]
    ends = @ends
    watch = ->(segment) { segment.singleton_class.prepend(WatchedSync) unless segment.singleton_class < WatchedSync }
    @store.instance_variable_get(:@segments).each(&watch)
    @store.singleton_class.prepend(Module.new do
      private define_method(:add_segment) { |*args, **kw| super(*args, **kw).tap(&watch) }
      define_method(:write_batch) do |batch|
        super(batch).tap { |segment| batch.each { |p| ends[p.message.global_id] = [segment, segment.size] } }
      end
      private :write_batch
    end)
  end

  def teardown
    @store&.close
    FileUtils.rm_rf(@dir)
  end

  def test_no_append_returns_before_a_finished_sync_covers_its_record
    early = Queue.new
    store = @store
    ends = @ends
    start = Queue.new
    threads = Array.new(THREADS) do |t|
      Thread.new do
        start.pop
        PER_THREAD.times do |i|
          msg = store.append("/d#{t}", Herald::Codec::Json.encode("é#{i}🎉\0"), codec: Herald::Codec::Json)
          segment, ends_at = ends.fetch(msg.global_id)
          synced = segment.synced_to || 0 # read at once: no blocking call since append returned
          early << [msg.global_id, ends_at, synced] if synced < ends_at
        end
      end
    end
    sleep 0.05
    THREADS.times { start << true }
    threads.each(&:join)
    records = THREADS * PER_THREAD
    assert_equal records, @ends.size
    assert early.empty?, "appends that returned before a sync covered their record (id, end, synced): " \
      "#{Array.new(early.size) { early.pop }.first(10).inspect}"
    syncs = SYNCS.size
    assert_operator syncs, :<, records / 2, "concurrent appenders share syncs: #{syncs} syncs for #{records} records"
    assert_operator @store.instance_variable_get(:@segments).size, :>, 1, "the run rolled segments"
  end
end
