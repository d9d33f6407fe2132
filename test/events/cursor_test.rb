# frozen_string_literal: true

require_relative "events_helper"

# A deferred subscriber's cursor is the one thing that says which events it is done with. A damaged
# cursor is never read as "start from the beginning": the Log store falls back to the previous good
# version (a few events run again, which at-least-once allows), and when there is none the subscriber
# stops loudly with CorruptCursorError while the others keep running.
class CursorTest < Minitest::Test
  include Herald::EventsTestSupport

  # What a disk, a copy or a hand can leave in cursors/NAME.
  DAMAGE = {
    "empty" => "",
    "truncated" => :truncated,
    "garbage" => "\x00\xFF\x13garbage\xC3".b,
    "zeros" => "\x00" * 16,
    "negative" => "-5",
    "non-numeric" => "abc",
    "number then junk" => "12abc",
    "bad checksum" => "7 00000000\n",
    "float" => "7.5",
    "spaces" => " 7 ",
    "emoji" => "7️⃣"
  }.freeze

  def test_a_damaged_cursor_without_a_previous_version_raises_a_named_error_naming_the_file
    DAMAGE.each do |label, content|
      store = log_store(File.join(@tmp, "nop-#{label.tr(" ", "_")}"))
      store.save_cursor("Mailer", 1234)
      damage(store, "Mailer", content)
      error = assert_raises(Herald::CorruptCursorError, label) { store.load_cursor("Mailer") }
      assert_includes error.message, File.join("cursors", "Mailer"), label
      assert_equal "Mailer", error.name
      store.close
    end
  end

  def test_a_damaged_cursor_falls_back_to_its_previous_version_and_says_so
    DAMAGE.each do |label, content|
      store = log_store(File.join(@tmp, "prev-#{label.tr(" ", "_")}"))
      store.save_cursor("Mailer", 40)
      store.save_cursor("Mailer", 42)
      damage(store, "Mailer", content)
      log = capture_log { assert_equal 40, store.load_cursor("Mailer"), label }
      assert_match(/WARN: cursor .*Mailer is damaged.*previous version 40/, log, label)
      store.close
    end
  end

  def test_a_damaged_previous_version_is_never_kept_as_the_good_one
    store = log_store
    store.save_cursor("Mailer", 40)
    damage(store, "Mailer", "garbage")
    store.save_cursor("Mailer", 50) # the damaged file is not copied over the previous version
    damage(store, "Mailer", "")
    assert_raises(Herald::CorruptCursorError) { store.load_cursor("Mailer") }
  end

  def test_cursors_round_trip_and_a_bare_id_written_by_an_older_herald_still_reads
    store = log_store
    [0, 1, 2**62].each do |id|
      store.save_cursor("Ünïcode 👋/name", id)
      assert_equal id, store.load_cursor("Ünïcode 👋/name")
    end
    File.binwrite(cursor_path(store, "Old"), "77")
    assert_equal 77, store.load_cursor("Old")
    assert_equal 0, store.load_cursor("Never saved")
  end

  def test_save_cursor_refuses_what_is_not_a_global_id_on_every_store
    [log_store, Herald::Store::Memory.new].each do |store|
      [-1, "5", nil, 1.5].each do |bad|
        assert_raises(Herald::InvalidArgumentError, "#{store.class} #{bad.inspect}") { store.save_cursor("X", bad) }
      end
      assert_equal 0, store.load_cursor("X")
      store.close
    end
  end

  # The defect: Worker#acquire kept the lease with cursor 0 after load_cursor raised, so every
  # retained event ran again, with one warning.
  def test_a_subscriber_with_a_damaged_cursor_stops_loudly_and_the_others_keep_running
    dir = File.join(@tmp, "stop")
    store = log_store(dir)
    10.times { |i| store.append("/events/n", Herald::Codec::Event.encode(Numbered.new(i + 1)), codec: Herald::Codec::Event) }
    store.save_cursor("Broken", 8)
    damage(store, "Broken", "garbage")
    broken = []
    fine = []
    errors = Queue.new
    b = define_subscriber("Broken", "/events/n", deferred: true) { |e, _m| broken << e.n }
    f = define_subscriber("Fine", "/events/n", deferred: true, start: :oldest) { |e, _m| fine << e.n }
    pool = nil
    log = capture_log do
      pool = Herald::Events::WorkerPool.new(store: store, subscribers: [b, f], threads: 1,
        on_error: ->(e, name) { errors << [e, name] })
      error, name = errors.pop
      assert_kind_of Herald::CorruptCursorError, error
      assert_equal "Broken", name
      eventually { fine.size == 10 }
      store.append("/events/n", Herald::Codec::Event.encode(Numbered.new(11)), codec: Herald::Codec::Event)
      eventually { fine.size == 11 }
      sleep Herald::Events::Worker::LEASE_RETRY + 0.1 # a stopped subscriber does not try again
      assert pool.shutdown(timeout: 2)
    end
    assert_equal [], broken, "no event replayed from cursor 0"
    assert_equal (1..11).to_a, fine
    assert errors.empty?, "reported once, not on every lease retry: #{errors.size} more"
    assert_kind_of Herald::CorruptCursorError, pool.workers.first.error
    assert_nil pool.workers.last.error
    refute_nil (lease = store.lease("Broken")), "the stopped subscriber let go of its lease"
    lease.release
    assert_empty log.lines.grep(/Broken/), "a custom on_error replaces the default log line"
  end

  def test_by_default_the_stopped_subscriber_is_logged_through_herald_logger_with_what_to_do
    store = use_store(log_store)
    store.save_cursor("Broken", 3)
    damage(store, "Broken", "")
    broken = []
    log = capture_log do
      define_subscriber("Broken", UserRegistered, deferred: true) { |e, _m| broken << e.user_id }
      5.times { |i| Herald.publish_event(UserRegistered.new(user_id: i)) }
      eventually { Herald::Events.runtime.workers.first&.error }
      sleep 0.1
    end
    assert_equal [], broken
    assert_match(/ERROR: deferred subscriber Broken stopped: Herald::CorruptCursorError: .*cursors.*Broken/, log)
    assert_match(/write the last global id it is done with/, log)
  end

  def test_a_subscriber_resumes_from_the_previous_cursor_version_replaying_only_what_follows_it
    dir = File.join(@tmp, "resume")
    store = log_store(dir)
    10.times { |i| store.append("/events/n", Herald::Codec::Event.encode(Numbered.new(i + 1)), codec: Herald::Codec::Event) }
    store.save_cursor("Mailer", 6)
    store.save_cursor("Mailer", 8)
    damage(store, "Mailer", :truncated)
    got = []
    sub = define_subscriber("Mailer", "/events/n", deferred: true) { |e, _m| got << e.n }
    capture_log do
      pool = Herald::Events::WorkerPool.new(store: store, subscribers: [sub], threads: 1)
      eventually { got.size >= 4 }
      assert pool.shutdown(timeout: 2)
    end
    assert_equal [7, 8, 9, 10], got, "two events ran again, none from the start"
    assert_equal 10, store.load_cursor("Mailer"), "the next save repairs the file"
  end

  private

  def cursor_path(store, name) = File.join(store.dir, "cursors", Herald::Store::Log::Directory.escape(name))

  def damage(store, name, content)
    path = cursor_path(store, name)
    content = File.binread(path)[0, File.size(path) / 2] if content == :truncated
    File.binwrite(path, content)
  end
end
