# frozen_string_literal: true

require_relative "../test_helper"

# Store#watch (Store::Watchers): the appending thread itself tells a watcher that the store moved, and for
# the Log another process's append pokes a socket of the watcher's own, so the event loop needs no thread
# in between (Herald::Rack::Reactor).
class StoreWatchTest < Minitest::Test
  def setup
    @dirs = []
    @stores = []
  end

  def teardown
    @stores.each(&:close)
    @dirs.each { |d| FileUtils.rm_rf(d) }
  end

  def test_memory_calls_its_watchers_on_the_appending_thread
    assert_called_on_the_appending_thread(Herald::Store::Memory.new.tap { |s| @stores << s })
  end

  def test_log_calls_its_watchers_on_the_appending_thread
    assert_called_on_the_appending_thread(log)
  end

  def test_log_calls_its_watchers_in_fsync_always_mode_too
    assert_called_on_the_appending_thread(log(fsync: :always))
  end

  def test_networked_stores_have_no_watch
    # The event loop must not wait for a network read: it keeps the bus's dispatcher for them. Without a
    # server: the capabilities are answered from the instance alone.
    [Herald::Store::Redis.new(url: "redis://127.0.0.1:1/0"), Herald::Store::Postgres.new(url: "postgres://127.0.0.1:1/x", migrate: false)].each do |store|
      assert_nil store.watch { flunk "never called" }, "#{store.class}: no watch"
      refute store.local_reads?, "#{store.class}: reads are round trips"
    ensure
      store&.close
    end
  end

  # Another process's append pokes the watcher's own socket; reading it in (on the watcher's thread) runs
  # the callback. The listener thread is stopped first: it cannot be the one that brought the record in.
  def test_a_log_watch_socket_hears_another_process
    store = log
    listener(store).kill
    calls = Queue.new
    watch = store.watch { calls << Thread.current }
    refute_nil watch.io, "a writable log directory gives the watcher a socket"
    pid = fork do
      other = Herald::Store::Log.new(dir: store.dir)
      other.append("/w", "from the child é 🎉", codec: Herald::Codec::Json)
      other.close
      exit!(0)
    end
    Process.wait(pid)
    assert IO.select([watch.io], nil, nil, 5), "the child's append never poked the watcher's socket"
    assert_equal 0, store.last_global_id, "nothing read it in but the watcher"
    watch.readable
    assert_equal [Thread.current], [calls.pop(true)], "called by the thread that read the records in"
    assert_equal ["from the child é 🎉"], store.global_backlog(0).map(&:payload)
    assert_nil IO.select([watch.io], nil, nil, 0), "every poke was read"
  end

  # The store's own appends call the watcher directly: poking its socket as well would wake the loop twice.
  def test_a_log_does_not_poke_its_own_watchers_socket
    store = log
    watch = store.watch {}
    store.append("/w", "x", codec: Herald::Codec::Json)
    assert_nil IO.select([watch.io], nil, nil, 0.2)
  end

  # Waking this process's event loop first let it take the GVL before the pokes went out (reading the
  # wakeup directory releases it) and keep it for its whole fan-out: other processes started theirs late.
  def test_a_log_pokes_other_processes_before_waking_its_own_watchers
    store = log
    peer = Herald::Store::Log.new(dir: store.dir).tap { |s| @stores << s }
    peer_watch = peer.watch {}
    seen = nil
    store.watch { seen = IO.select([peer_watch.io], nil, nil, 0) ? :poked : :not_yet }
    store.append("/w", "x", codec: Herald::Codec::Json)
    assert_equal :poked, seen
  end

  def test_a_cancelled_log_watch_is_neither_called_nor_left_on_disk
    store = log
    calls = 0
    watch = store.watch { calls += 1 }
    markers = Dir[File.join(store.dir, "wakeup", "*w.sock")]
    assert_equal 1, markers.size
    watch.cancel
    store.append("/w", "x", codec: Herald::Codec::Json)
    assert_equal 0, calls
    assert_empty Dir[File.join(store.dir, "wakeup", "*w.sock")]
    assert watch.io.closed?
  end

  # A forked child inherits its parent's watchers (and the parent's event loop pipe): they are not called there.
  def test_a_forked_child_does_not_call_its_parents_watchers
    store = Herald::Store::Memory.new.tap { |s| @stores << s }
    reader, writer = IO.pipe
    store.watch { writer.write("P") }
    pid = fork do
      reader.close
      store.append("/w", "in the child", codec: Herald::Codec::Json)
      writer.write("C")
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    assert_equal "C", reader.read
  end

  private

  def log(**options)
    dir = Dir.mktmpdir("herald-watch").tap { |d| @dirs << d }
    Herald::Store::Log.new(dir: dir, **options).tap { |s| @stores << s }
  end

  def listener(store) = store.instance_variable_get(:@wakeup).instance_variable_get(:@thread)

  def assert_called_on_the_appending_thread(store)
    calls = Queue.new
    watch = store.watch { calls << [Thread.current, store.last_global_id] }
    appender = Thread.new { 3.times { |i| store.append("/w", "m#{i} ✓", codec: Herald::Codec::Json) } }
    appender.join
    assert_equal 3, calls.size, "once per append, before append returns"
    seen = 3.times.map { calls.pop }
    assert_equal [appender] * 3, seen.map(&:first), "called by the thread that appended"
    assert_equal [1, 2, 3], seen.map(&:last), "called once the record is readable"
    watch.cancel
    store.append("/w", "after", codec: Herald::Codec::Json)
    assert_equal 0, calls.size, "not after cancel"
  end
end
