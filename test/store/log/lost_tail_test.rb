# frozen_string_literal: true

require_relative "../../test_helper"

# A lost tail (power loss in fsync :interval mode, damage at the end of the log) takes back records readers
# may have seen. Their ids, global and per channel, are never handed out again, and a reader whose saved
# cursor points past them misses none of the new records.
class LogLostTailTest < Minitest::Test
  TRIALS = Integer(ENV.fetch("LOST_TAIL_TRIALS", "120"))
  CHANNELS = ["/a", "/b", "/ch/é 👋", "/a"].freeze
  SITES = [nil, nil, "site-ü"].freeze

  def setup
    @dir = Dir.mktmpdir("herald-lost-tail")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_records_lost_by_a_crash_keep_their_ids_and_a_cursor_past_them_misses_nothing
    handed = publish_in_child(20, rng: Random.new(1))
    truncate_to_record(12) # records 13..20 never reached the disk
    store = quietly { open_store }
    assert_equal 12, store.global_backlog(0).size
    check_no_reuse(store, handed, "crash")
  ensure
    store&.close
  end

  # The records were synced, the store closed cleanly, then the end of the segment was lost (disk damage).
  def test_records_lost_after_a_clean_close_keep_their_ids
    handed = publish_in_child(10, rng: Random.new(2), close: true)
    truncate_to_record(4)
    store = quietly { open_store }
    check_no_reuse(store, handed, "clean close")
  ensure
    store&.close
  end

  # A child inherits an open store; the parent closes first (giving back its unused ids); the child's
  # publishes must reserve again rather than trust the parent's reservation.
  def test_a_forked_child_publishing_after_the_parent_closed_reserves_its_own_ids
    store = open_store
    append(store, "/a", "parent")
    r, w = IO.pipe
    go_r, go_w = IO.pipe
    pid = fork do
      r.close
      go_w.close
      go_r.read(1)
      ids = 5.times.map { append(store, "/a", "child").then { |m| [m.global_id, "/a", m.message_id] } }
      w.write(Marshal.dump(ids))
      w.close
      Process.kill(:KILL, Process.pid)
    end
    w.close
    go_r.close
    store.close
    go_w.write(".")
    go_w.close
    handed = Marshal.load(r.read) # standard:disable Security/MarshalLoad
    Process.wait(pid)
    truncate_to_record(1)
    again = quietly { open_store }
    check_no_reuse(again, handed.to_h { |g, c, m| [g, [c, nil, m]] }, "fork")
  ensure
    again&.close
  end

  # No false alarm: a store opened while another is open, or after a clean close, carries on with the
  # next ids (global and per channel) and logs nothing.
  def test_a_second_open_store_and_a_clean_reopen_carry_on_with_the_next_ids
    first = open_store
    3.times { |i| append(first, "/a", i) }
    second = nil
    _, err = capture_io do
      second = open_store
      assert_equal [4, 4], append(second, "/a", 3).then { |m| [m.global_id, m.message_id] }
      assert_equal [5, 5], append(first, "/a", 4).then { |m| [m.global_id, m.message_id] }
      first.close
      second.close
      third = open_store
      assert_equal [6, 6], append(third, "/a", 5).then { |m| [m.global_id, m.message_id] }
      third.close
    end
    refute_match(/#{Regexp.escape(@dir)}/, err) # (other tests' stores may log meanwhile)
  end

  # Seeded: a child publishes on several channels and sites, saves a reader's cursor, and dies (kill -9)
  # or closes; the end of the segment is then cut, overwritten or flipped. Reopened, the log never hands
  # out an id it handed out before, and the reader's cursor sees every new record.
  def test_random_lost_tails_never_reuse_an_id
    seed = Integer(ENV.fetch("SEED", Random.new_seed.to_s[0, 8]))
    puts "LogLostTailTest: SEED=#{seed} LOST_TAIL_TRIALS=#{TRIALS}"
    rng = Random.new(seed)
    TRIALS.times do |trial|
      FileUtils.rm_rf(@dir)
      FileUtils.mkdir_p(@dir)
      handed = publish_in_child(rng.rand(1..60), rng: Random.new(rng.rand(2**31)), close: rng.rand(4).zero?)
      damage_tail(rng)
      store = quietly { open_store }
      check_no_reuse(store, handed, "SEED=#{seed} trial #{trial}")
      store.close
    end
  end

  private

  def open_store(**options) = Herald::Store::Log.new(dir: @dir, fsync: :interval, **options)

  def append(store, channel, data, site_id: nil) = store.append(channel, json_codec.encode(data), codec: json_codec, site_id: site_id)

  # Publishes `count` records in a child (random channels, sites and sizes), saves the cursor "reader" at
  # a random handed-out id, then dies by kill -9 (or closes). Returns {global id => [channel, site, message id]}.
  def publish_in_child(count, rng:, close: false)
    r, w = IO.pipe
    pid = fork do
      r.close
      store = open_store
      handed = count.times.to_h do |i|
        channel = CHANNELS[rng.rand(CHANNELS.size)]
        site = SITES[rng.rand(SITES.size)]
        m = append(store, channel, "#{i} #{"x" * rng.rand(0..300)}", site_id: site)
        [m.global_id, [channel, site, m.message_id]]
      end
      store.save_cursor("reader", handed.keys.sample(random: rng))
      w.write(Marshal.dump(handed))
      w.close
      close ? store.close : Process.kill(:KILL, Process.pid)
      exit!(0)
    end
    w.close
    handed = Marshal.load(r.read) # standard:disable Security/MarshalLoad
    Process.wait(pid)
    handed
  end

  # New records after the damage: every global id above every id handed out before, every message id
  # above the channel's, and all of them after the reader's cursor.
  def check_no_reuse(store, handed, label)
    cursor = store.load_cursor("reader")
    fresh = (CHANNELS + ["/new"]).uniq.product(SITES.uniq).map do |channel, site|
      append(store, channel, "fresh", site_id: site).then { |m| [m, channel, site] }
    end
    fresh.each do |m, channel, site|
      assert_operator m.global_id, :>, handed.keys.max, "#{label}: global id #{m.global_id} was handed out before"
      seen = handed.values.select { |c, s, _| c == channel && s == site }.map(&:last).max || 0
      assert_operator m.message_id, :>, seen, "#{label}: #{channel} (site #{site.inspect}) id #{m.message_id} was handed out before"
    end
    after = store.global_backlog(cursor).map(&:global_id)
    fresh.each { |m, _, _| assert_includes after, m.global_id, "#{label}: the reader at #{cursor} misses #{m.global_id}" }
  end

  def segment = Dir[File.join(@dir, "*.log")].max

  def record_offsets
    image = File.binread(segment)
    offsets = []
    pos = 0
    while pos + 8 <= image.bytesize
      offsets << pos
      pos += 8 + image.unpack1("L<", offset: pos)
    end
    offsets
  end

  def truncate_to_record(count) = File.truncate(segment, record_offsets[count] || File.size(segment))

  # Damage at the end of the log: a cut at a record boundary or anywhere, then sometimes garbage or
  # flipped bits over what is left of the last records.
  def damage_tail(rng)
    offsets = record_offsets
    keep = rng.rand(offsets.size + 1)
    size = offsets[keep] || File.size(segment)
    size = rng.rand(size..[size + 40, File.size(segment)].min) if rng.rand(2).zero?
    File.truncate(segment, size)
    return if size.zero? || rng.rand(3).zero?
    image = File.binread(segment)
    at = rng.rand([image.bytesize - 64, 0].max...image.bytesize)
    if rng.rand(2).zero?
      image[at, 16] = rng.bytes(16)
    else
      image.setbyte(at, image.getbyte(at) ^ (1 << rng.rand(8)))
    end
    File.binwrite(segment, image)
  end

  def quietly(&block)
    result = nil
    capture_io { result = block.call }
    result
  end
end
