# frozen_string_literal: true

require_relative "../../test_helper"
require "herald/cli"
require "stringio"

# Damaged META, STATE and IDS files (empty, cut short, garbage, wrong types; STATE and IDS deleted). META cannot be rebuilt: opening
# raises CorruptStoreError naming it. STATE and IDS are rebuilt with a warning, without any id going back.
# `herald check` reports each of them and exits 1.
class LogSideFilesTest < Minitest::Test
  WRONG_TYPES = {
    "META" => ['{"format":1,"epoch":5,"segment_bytes":1024}', '{"format":1,"epoch":"ab","segment_bytes":"big"}', '{"epoch":"ab","segment_bytes":1024}'],
    "STATE" => ['{"last_global_id":"7","channels":{}}', '{"last_global_id":7,"channels":[]}', '{"last_global_id":7,"channels":{"/a":["x",null,null]}}', '{"last_global_id":-3,"channels":{}}'],
    "IDS" => ['{"reserved":-1,"floor":0}', '{"reserved":"9","floor":0}', '{"reserved":9}']
  }.freeze

  def setup
    @dir = Dir.mktmpdir("herald-side-files")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_a_damaged_meta_is_a_named_error_naming_the_file_and_what_to_do
    each_damage("META") do |label|
      error = assert_raises(Herald::CorruptStoreError, label) { open_store }
      assert_equal meta, error.file, label
      assert_includes error.message, meta, label
      assert_match(/restore it from a backup, or delete it/, error.message, label)
      assert_kind_of Herald::StoreError, error
      check_reports("META", label)
    end
    File.delete(meta)
    store = quietly { open_store }
    assert_equal @retained, store.global_backlog(0).map(&:data), "deleting META (as the message says) opens the log with its messages"
    store.close
  end

  def test_herald_publish_with_a_damaged_meta_names_the_file_not_the_json_argument
    write_log
    File.write(meta, "")
    err = StringIO.new
    status = with_env("HERALD_DIR" => @dir, "HERALD_STORE" => nil) { Herald::CLI.run(["publish", "/a", '{"ok":true}'], out: StringIO.new, err: err) }
    assert_equal 1, status
    assert_includes err.string, meta
    refute_match(/JSON is not valid/, err.string)
  end

  # Channel /gone's records were all deleted by retention: only STATE remembers its last id (3).
  def test_a_damaged_state_is_rebuilt_with_a_warning_and_no_id_goes_back
    each_damage("STATE") do |label|
      handed = @handed
      check_reports("STATE", label)
      store, err = open_with_log
      assert_match(/#{Regexp.escape(state)} is (damaged|missing).*rebuilt from the segments/, err, label)
      assert_equal @retained, store.global_backlog(0).map(&:data), label
      assert_operator append(store, "/gone", "again").message_id, :>, 3, "#{label}: /gone's ids do not start over"
      assert_operator append(store, "/busy", "again").global_id, :>, handed, label
      store.close
      Herald::Store::Log::Directory.read_json(state) # rewritten whole
      _, err = open_with_log.tap { |s, _| s.close }
      refute_match(/#{Regexp.escape(@dir)}/, err, "#{label}: rebuilt once")
    end
  end

  def test_a_damaged_ids_file_is_rebuilt_with_a_warning_and_no_id_goes_back
    each_damage("IDS") do |label|
      check_reports("IDS", label)
      store, err = open_with_log
      assert_match(/#{Regexp.escape(ids)} is (damaged|missing).*rebuilt/, err, label)
      msg = append(store, "/busy", "again")
      assert_operator msg.global_id, :>, @handed, label
      assert_operator msg.message_id, :>, @handed, label
      store.close
      Herald::Store::Log::Directory.read_json(ids)
    end
  end

  # Damaged while the log is open: the next reservation rebuilds it (with the margin), and ids never go back.
  def test_an_ids_file_damaged_while_the_log_is_open_is_rebuilt_by_the_next_reservation
    store = open_store
    first = append(store, "/a", 0).global_id
    File.write(ids, "{\"reserved\":")
    _, err = capture_io { 1100.times { |i| append(store, "/a", i) } }
    assert_match(/#{Regexp.escape(ids)} is damaged .*rebuilt/, err)
    reserved = Herald::Store::Log::Directory.read_json(ids)["reserved"]
    assert_operator reserved, :>, first + Herald::Store::Log::Reservation::REBUILD_MARGIN, "ids restart well above the log"
    store.close
  end

  def test_check_is_clean_and_exits_zero_for_intact_side_files
    write_log
    out = StringIO.new
    assert_equal 0, Herald::CLI.run(["check", @dir], out: out, err: StringIO.new)
    refute_match(/damaged/, out.string)
  end

  private

  def open_store(**options) = Herald::Store::Log.new(dir: @dir, fsync: :never, segment_bytes: 1024, max_backlog_size: 5, **options)

  def append(store, channel, data, **options) = store.append(channel, json_codec.encode(data), codec: json_codec, **options)

  def meta = File.join(@dir, "META")

  def state = File.join(@dir, "STATE")

  def ids = File.join(@dir, "IDS")

  # A log whose first segments were deleted (so STATE exists; /gone's records expired), closed cleanly.
  def write_log
    store = open_store
    3.times { |i| append(store, "/gone", "gone #{i}", max_backlog_age: 0.02) }
    sleep 0.03
    @handed = 3 + 60.times { |i| append(store, "/busy", "busy #{i} #{"é" * 20}") }.size
    @retained = store.global_backlog(0).map(&:data)
    store.close
    assert File.exist?(state), "segments were deleted, STATE saved"
    refute File.exist?(File.join(@dir, Herald::Store::Log::Segment.file_name(1))), "the first segment is gone"
  end

  # Every kind of damage for one file, each on a fresh log: empty, cut short, garbage, JSON of the wrong shape.
  def each_damage(name)
    seed = Integer(ENV.fetch("SEED", Random.new_seed.to_s[0, 8]))
    rng = Random.new(seed)
    damages = {"empty" => ->(_) { "" }, "cut short" => ->(good) { good[0, good.size / 2] },
               "garbage" => ->(_) { rng.bytes(rng.rand(1..200)) }, "NUL bytes" => ->(good) { "\0" * good.bytesize },
               "not an object" => ->(_) { %w[[] null 42 "x"].sample(random: rng) }}
    WRONG_TYPES.fetch(name).each_with_index { |json, i| damages["wrong types #{i}"] = ->(_) { json } }
    damages["deleted"] = ->(_) {} unless name == "META" # a missing META only starts a new epoch
    damages.each do |kind, damage|
      FileUtils.rm_rf(@dir)
      write_log
      path = File.join(@dir, name)
      damaged = damage.call(File.binread(path))
      damaged ? File.binwrite(path, damaged) : File.delete(path)
      yield "#{name} #{kind} (SEED=#{seed})"
    end
  end

  def check_reports(name, label)
    out = StringIO.new
    assert_equal 1, Herald::CLI.run(["check", @dir], out: out, err: StringIO.new), "#{label}: check exits 1"
    assert_includes out.string, "damaged file: #{File.join(@dir, name)} is ", label
    assert_includes out.string, "0 corrupt, 1 damaged side file\n", label
  end

  def open_with_log
    store = nil
    _, err = capture_io { store = open_store }
    [store, err]
  end

  def quietly(&block)
    result = nil
    capture_io { result = block.call }
    result
  end

  def with_env(vars)
    saved = vars.keys.to_h { |k| [k, ENV[k]] }
    vars.each { |k, v| ENV[k] = v }
    yield
  ensure
    saved.each { |k, v| ENV[k] = v }
  end
end
