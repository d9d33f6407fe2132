# frozen_string_literal: true

require_relative "../test_helper"
require_relative "contract"

class LogStoreTest < Minitest::Test
  include StoreContract

  def setup
    @dirs = []
    super
  end

  def teardown
    super
    @dirs.each { |d| FileUtils.rm_rf(d) }
  end

  def build_store(**options)
    dir = Dir.mktmpdir("herald-log")
    @dirs << dir
    Herald::Store::Log.new(dir: dir, fsync: :never, **options)
  end

  def test_messages_survive_reopen_with_ids_that_keep_increasing
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = Herald::Store::Log.new(dir: dir)
    append("/a", "one", store: s, user_ids: [1], site_id: "x")
    append("/b", {"two" => 2}, store: s)
    epoch = s.epoch
    s.close
    again = store_in(dir)
    assert_equal epoch, again.epoch
    assert_equal [{"two" => 2}], again.backlog("/b", 0).map(&:data)
    msg = again.backlog("/a", 0, site_id: "x").first
    assert_equal ["one", [1], "x"], [msg.data, msg.user_ids, msg.site_id]
    assert_equal 3, append("/c", 3, store: again).global_id
    assert_equal 2, append("/b", 3, store: again).message_id
  end

  def test_concurrent_always_appends_share_fsyncs_and_all_survive_reopen
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = store_in(dir, fsync: :always)
    threads = 8.times.map { |t| Thread.new { 40.times.map { |i| append("/g#{t % 2}", [t, i], store: s) } } }
    returned = threads.flat_map(&:value)
    assert_equal (1..320).to_a, returned.map(&:global_id).sort
    s.close
    again = store_in(dir)
    assert_equal (1..160).to_a, again.backlog("/g0", 0).map(&:message_id)
    assert_equal returned.sort_by(&:global_id).map(&:data), again.global_backlog(0).map(&:data)
  end

  def test_unknown_fsync_mode_is_an_argument_error
    assert_raises(ArgumentError) { Herald::Store::Log.new(dir: Dir.mktmpdir, fsync: :sometimes) }
  end

  private

  def store_in(dir, **options) = Herald::Store::Log.new(dir: dir, **options).tap { |s| @stores << s }
end
