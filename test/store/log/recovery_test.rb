# frozen_string_literal: true

require_relative "../../test_helper"
require "herald/cli"
require "stringio"

# Recovery on open: damage at the tail is cut, damage in the middle is skipped and reported.
class LogRecoveryTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("herald-recovery")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_a_tail_cut_at_every_offset_of_the_last_record_leaves_exactly_the_earlier_records
    write_messages(3)
    image = File.binread(segment)
    last_start = record_offsets.last
    handed_out = 3
    (last_start...image.bytesize).each do |size|
      File.binwrite(segment, image.byteslice(0, size))
      store = quietly { open_store }
      assert_equal [0, 1], store.global_backlog(0).map(&:data), "cut at #{size}"
      assert_equal last_start, File.size(segment), "torn tail cut from the file (size #{size})"
      # The cut record (and the one appended after it in the previous round) may have been seen.
      assert_equal handed_out + 1, (handed_out = append(store, "again").global_id), "no id is handed out twice"
      store.close
    end
  end

  def test_zeros_or_garbage_after_the_last_record_are_cut_and_appends_continue
    write_messages(2)
    good = File.size(segment)
    [("\0" * 4096).b, Random.new(7).bytes(4096)].each do |junk|
      File.open(segment, "ab") { |f| f.write(junk) }
      store = quietly { open_store }
      assert_equal good, File.size(segment)
      msg = append(store, "after")
      store.close
      store = open_store
      assert_equal "after", store.global_backlog(msg.global_id - 1).first.data
      assert_empty store.corrupt_records
      store.close
      good = File.size(segment)
    end
  end

  def test_a_bit_flip_in_a_middle_record_is_skipped_reported_and_found_by_check
    write_messages(5)
    offset = record_offsets[2]
    flip_bit(offset + 30)
    store = nil
    _, err = capture_io { store = open_store }
    assert_equal [0, 1, 3, 4], store.global_backlog(0).map(&:data)
    assert_equal [[segment, offset]], store.corrupt_records.map { |e| [e.segment, e.offset] }
    assert_match(/corrupt record in #{Regexp.escape(segment)} at offset #{offset}/, err)
    assert_equal 6, append(store, 5).global_id
    store.close
    out = StringIO.new
    assert_equal 1, Herald::CLI.run(["check", @dir], out: out, err: StringIO.new)
    assert_includes out.string, "corrupt record: #{segment} at byte offset #{offset}"
  end

  def test_a_flipped_length_field_is_skipped_and_the_next_records_are_kept
    write_messages(4)
    flip_bit(record_offsets[1] + 2) # length's third byte: the frame claims megabytes
    store = quietly { open_store }
    assert_equal [0, 2, 3], store.global_backlog(0).map(&:data)
    assert_equal 1, store.corrupt_records.size
  end

  # Seeded random damage (bit flips, overwritten runs, cuts, inserted garbage, duplicated records):
  # opening always succeeds and only ever returns records that were written, in order, once each.
  def test_random_damage_never_breaks_open_nor_returns_bad_records
    write_messages(30)
    pristine = File.binread(segment)
    offsets = record_offsets
    written = open_store.global_backlog(0).to_h { |m| [m.global_id, m.data] }
    rng = Random.new(2026)
    150.times do |round|
      File.binwrite(segment, damage(pristine.dup, offsets, rng))
      store = quietly { open_store }
      found = store.global_backlog(0)
      ids = found.map(&:global_id)
      assert_equal ids.uniq.sort, ids, "round #{round}: ids increase"
      found.each { |m| assert_equal written[m.global_id], m.data, "round #{round}: id #{m.global_id}" }
      store.close
      assert_equal store.corrupt_records.empty?, Herald::Store::Log::Checker.new(@dir).run.ok?, "round #{round}: check agrees"
    end
  end

  def test_check_exits_zero_for_a_clean_log
    write_messages(3)
    out = StringIO.new
    assert_equal 0, Herald::CLI.run(["check", @dir], out: out, err: StringIO.new)
    assert_includes out.string, "3 good records, 0 corrupt"
  end

  private

  def open_store(**options) = Herald::Store::Log.new(dir: @dir, fsync: :never, **options)

  def append(store, data) = store.append("/r", json_codec.encode(data), codec: json_codec)

  def write_messages(count)
    store = open_store
    count.times { |i| append(store, i) }
    store.close
  end

  def segment = Dir[File.join(@dir, "*.log")].min

  def record_offsets
    image = File.binread(segment)
    offsets = []
    pos = 0
    while pos < image.bytesize
      offsets << pos
      pos += 8 + image.unpack1("L<", offset: pos)
    end
    offsets
  end

  def damage(image, offsets, rng)
    at = rng.rand(image.bytesize)
    case rng.rand(5)
    when 0 then 3.times {
      i = rng.rand(image.bytesize)
      image.setbyte(i, image.getbyte(i) ^ (1 << rng.rand(8)))
    }
    when 1 then image[at, 16] = rng.bytes(16)
    when 2 then image = image.byteslice(0, at)
    when 3 then image.insert(at, rng.bytes(rng.rand(1..64)))
    else
      start = offsets.sample(random: rng)
      image << image.byteslice(start, 120) # a record (or part of one) appended twice
    end
    image
  end

  def flip_bit(offset)
    File.open(segment, "r+b") do |f|
      f.seek(offset)
      byte = f.read(1).ord
      f.seek(offset)
      f.write((byte ^ 0x10).chr)
    end
  end

  def quietly(&block)
    result = nil
    capture_io { result = block.call }
    result
  end
end
