# frozen_string_literal: true

require_relative "../../test_helper"

# Retention on disk: whole segments go once nothing in them is retained; ids never go back.
class LogRetentionTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("herald-retention")
  end

  def teardown
    @stores&.each(&:close) # a store left open keeps polling its deleted directory, and says so
    FileUtils.rm_rf(@dir)
  end

  def test_segments_roll_and_old_ones_are_deleted_once_nothing_in_them_is_retained
    store = open_store(max_backlog_size: 10)
    200.times { |i| append(store, "/a", i) }
    files = segments
    assert_operator files.size, :<, 10, "old segments deleted (#{files.size} left)"
    assert_equal (190...200).to_a, store.backlog("/a", 0).map(&:data)
    first_kept = Integer(File.basename(files.first, ".log"), 10)
    assert_operator first_kept, :<=, 191, "no segment holding a retained message was deleted"
    store.close
    again = open_store(max_backlog_size: 10)
    assert_equal (190...200).to_a, again.backlog("/a", 0).map(&:data)
    assert_equal 200, again.last_id("/a")
    assert_equal 201, append(again, "/a", 200).message_id
  end

  def test_a_channel_whose_records_were_all_deleted_keeps_counting_after_reopen
    store = open_store(max_backlog_size: 5)
    append(store, "/once", "x", max_backlog_age: 0.05)
    sleep 0.1
    100.times { |i| append(store, "/busy", i) }
    refute segments.include?(File.join(@dir, "00000000000000000001.log")), "the first segment was deleted"
    store.close
    again = open_store(max_backlog_size: 5)
    assert_equal 1, again.last_id("/once")
    assert_equal 2, append(again, "/once", "y").message_id
    assert_equal 102, again.last_global_id
  end

  def test_retention_set_by_a_publish_survives_reopen
    store = open_store
    append(store, "/small", 0, max_backlog_size: 3)
    10.times { |i| append(store, "/small", i + 1) }
    store.close
    again = open_store
    assert_equal [8, 9, 10], again.backlog("/small", 0).map(&:data)
    append(again, "/small", 11)
    assert_equal [9, 10, 11], again.backlog("/small", 0).map(&:data)
  end

  # Which segments hold a retained message is worked out when a segment is full (Index#live_segments), from
  # the channels' backlogs: channels of different sizes, interleaved, some spanning many segments. A segment
  # holding a retained message is never deleted; once retired, every old segment left holds one.
  def test_only_segments_without_retained_messages_are_deleted
    seed = Integer(ENV.fetch("SEED", rand(1 << 30)))
    random = Random.new(seed)
    store = open_store
    sizes = {"/one" => 1, "/few" => 3, "/many" => 40, "/rare" => 7, "/é😀" => 5}
    800.times do |i|
      channel = (random.rand < 0.02) ? "/rare" : sizes.keys.sample(random: random)
      append(store, channel, "#{i}#{"x" * random.rand(0..60)}", max_backlog_size: sizes[channel])
      next unless i % 50 == 49
      store.send(:retire) if i % 100 == 99
      bases = segments.map { |f| Integer(File.basename(f, ".log"), 10) }
      retained = sizes.keys.flat_map { |c| store.backlog(c, 0).map(&:global_id) }
      holding = retained.map { |id| bases.select { |b| b <= id }.max }
      assert holding.none?(&:nil?), "SEED=#{seed}: a retained message's segment was deleted"
      if i % 100 == 99
        assert_equal bases[0...-1], bases[0...-1] & holding, "SEED=#{seed}: a segment left after retire holds nothing retained"
      end
    end
    store.close
    again = open_store
    sizes.each_key { |c| assert_equal store.backlog(c, 0).map(&:payload), again.backlog(c, 0).map(&:payload), "SEED=#{seed}" }
  end

  private

  def open_store(**options) = Herald::Store::Log.new(dir: @dir, fsync: :never, segment_bytes: 1024, **options).tap { |s| (@stores ||= []) << s }

  def append(store, channel, data, **options) = store.append(channel, json_codec.encode(data), codec: json_codec, **options)

  def segments = Dir[File.join(@dir, "*.log")].sort
end
