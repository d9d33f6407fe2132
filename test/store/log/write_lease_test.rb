# frozen_string_literal: true

require_relative "../../test_helper"
require "logger"
require "stringio"

# The write lock kept between appends (Log::WriteLease): held while nobody else wants it, given up when
# another store asks, never outliving its holder.
class LogWriteLeaseTest < Minitest::Test
  # A datagram socket bound and marked in the wakeup directory the way a store's is (Wakeup), so every
  # "lease" request reaches it too; a thread of its own keeps reading (the pokes of every append would
  # fill its buffer) and counts the requests.
  class Spy
    def initialize(wakeup)
      stat = File.stat(wakeup)
      name = "spy-1.sock"
      @socket = Socket.new(:UNIX, :DGRAM)
      @socket.bind(Socket.sockaddr_un("\0herald-#{stat.dev.to_s(16)}-#{stat.ino.to_s(16)}-#{name}"))
      File.write(File.join(wakeup, name), "")
      @asks = 0
      @thread = Thread.new do
        loop do
          @socket.wait_readable
          while (data = @socket.recv_nonblock(64, exception: false)).is_a?(String)
            @asks += 1 if data == Herald::Store::Log::Wakeup::LEASE
          end
        end
      end
    end

    # Stops reading; the lease requests counted.
    def stop
      return @asks if @socket.closed?
      sleep 0.05 # the last datagrams
      @thread.kill.join
      @socket.close
      @asks
    end
  end

  def setup
    @dir = Dir.mktmpdir("herald-lease")
  end

  def teardown
    kill_children
    @stores&.each(&:close)
    FileUtils.rm_rf(@dir)
  end

  # The store keeps LOCK between appends (no flock, fstat, flock per publish), and gives it up when asked.
  def test_the_lock_is_kept_between_appends_and_given_up_when_asked
    store = open_store
    append(store, "/a", "é🎉\0")
    other = File.new(File.join(@dir, "LOCK"), File::RDWR)
    refute other.flock(File::LOCK_EX | File::LOCK_NB), "the store dropped the lock after its append"
    Herald::Store::Log::Wakeup.ask_for_lease(File.join(@dir, "wakeup"))
    eventually(timeout: 2, message: "the lease was not given up") { other.flock(File::LOCK_EX | File::LOCK_NB) }
    # Someone else wrote meanwhile (a record only this process's second store knows of): the next append
    # takes the lock back, reads what was appended, and carries on with the next ids.
    other.flock(File::LOCK_UN)
    twin = open_store
    assert_equal 2, append(twin, "/a", "twin").message_id
    assert_equal [3, 3], append(store, "/a", "back").then { |m| [m.global_id, m.message_id] }
    assert_equal ["é🎉\0", "twin", "back"], open_store.backlog("/a", 0).map(&:data)
  ensure
    other&.close
  end

  # A writer publishing as fast as it can does not starve a writer in another process: the lease
  # changes hands, ids stay dense and in order.
  def test_a_busy_writer_does_not_starve_another_process
    busy = open_store
    stop = false
    thread = Thread.new { append(busy, "/busy", 1) until stop }
    sleep 0.05
    r, w = IO.pipe
    pid = fork do
      r.close
      store = Herald::Store::Log.new(dir: @dir, fsync: :never, max_backlog_size: 100_000)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      ids = Array.new(50) { |i| append(store, "/other", i).message_id }
      w.puts [ids.join(","), Process.clock_gettime(Process::CLOCK_MONOTONIC) - started].join(" ")
      store.close
      exit!(0)
    end
    w.close
    line = Timeout.timeout(30) { r.gets }
    Process.wait(pid)
    stop = true
    thread.join
    ids, took = line.split
    assert_equal (1..50).to_a, ids.split(",").map(&:to_i)
    assert_operator took.to_f, :<, 10, "50 publishes took #{took} s beside a busy writer"
    fresh = open_store
    all = fresh.global_backlog(0)
    assert_equal (1..all.size).to_a, all.map(&:global_id)
    assert_equal (1..fresh.last_id("/busy")).to_a, fresh.backlog("/busy", 0).map(&:message_id)
  ensure
    stop = true
    r&.close
  end

  # Two processes publishing into one directory at once (a Puma cluster): a writer that finds the lock taken
  # waits in the kernel and the holder hands the lock over when it sees it (WAITERS), instead of a "lease"
  # datagram to every store for each handoff and polling. A socket of the test's, registered like a store's,
  # counts the datagrams; the code before this change sent 100-150 for these 6,000 appends, this one 8.
  def test_concurrent_writers_hand_the_lock_over_without_asking_for_it_each_time
    open_store.close
    spy = Spy.new(File.join(@dir, "wakeup"))
    n = 3000
    r, w = IO.pipe
    pids = 2.times.map do |i|
      fork do
        r.close
        store = Herald::Store::Log.new(dir: @dir, fsync: :never, max_backlog_size: 100_000)
        append(store, "/warm", i)
        w.puts "ready"
        w.flush
        sleep 0.2 # both open and listening before either publishes
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        ids = Array.new(n) { |j| append(store, "/p#{i}", "é🎉\0 #{j}").message_id }
        w.puts [i, ids == (1..n).to_a, started, Process.clock_gettime(Process::CLOCK_MONOTONIC)].join(" ")
        store.close
        exit!(0)
      end
    end
    w.close
    2.times { assert_equal "ready\n", Timeout.timeout(30) { r.gets } }
    results = 2.times.map { Timeout.timeout(60) { r.gets }.split }
    pids.each { |pid| Process.wait(pid) }
    asks = spy.stop
    assert_equal [["0", "true"], ["1", "true"]], results.map { |i, dense, *| [i, dense] }.sort, "per-channel ids not dense"
    (s0, e0), (s1, e1) = results.map { |*, s, e| [s.to_f, e.to_f] }
    overlap = [e0, e1].min - [s0, s1].max
    assert_operator overlap, :>, 0.5 * [e0 - s0, e1 - s1].min, "the writers hardly met: nothing was measured (#{results.inspect})"
    assert_operator asks, :<, 2 * n / 100, "#{asks} lease datagrams for #{2 * n} appends"
    fresh = open_store
    assert_equal 2 * n + 2, fresh.last_global_id
    assert_equal (1..2 * n + 2).to_a, fresh.global_backlog(0).map(&:global_id)
    assert_equal (0...n).map { |j| "é🎉\0 #{j}" }, fresh.backlog("/p1", 0).map(&:data)
  ensure
    r&.close
    spy&.stop
  end

  # A forked child shares its parent's descriptor of LOCK, and with it the parent's lease: killed, the
  # parent must not leave its lease alive in the child.
  def test_a_killed_parent_does_not_leave_its_lease_in_its_child
    r, w = IO.pipe
    go_r, go_w = IO.pipe
    parent = fork do
      r.close
      go_w.close
      store = Herald::Store::Log.new(dir: @dir, fsync: :never)
      append(store, "/p", "parent")
      child = fork do
        go_r.read(1) # the parent is dead by now
        GC.disable # a collected File closes its descriptor: the test must not pass by that luck
        w.puts append(store, "/p", "child").message_id
        exit!(0)
      end
      w.puts child
      sleep
    end
    w.close
    go_r.close
    child = Integer(r.gets)
    Process.kill(:KILL, parent)
    Process.wait(parent)
    go_w.write("x")
    go_w.close
    assert_equal "2", Timeout.timeout(10) { r.gets }&.chomp, "the child could not take the lock"
  ensure
    [parent, child].compact.each { |pid| Process.kill(:KILL, pid) rescue nil } # standard:disable Style/RescueModifier
  end

  # A process stopped after publishing (SIGSTOP, a console suspended with ^Z) hears no one asking for its
  # lease: its listener drops the lease once unused for IDLE, so others keep writing.
  def test_a_process_stopped_after_publishing_does_not_keep_others_from_writing
    pid = sleeping_child { append(Herald::Store::Log.new(dir: @dir, fsync: :never), "/a", "before the stop") }
    sleep 0.2 # well past IDLE: its listener has dropped the lease
    Process.kill(:STOP, pid)
    store = Herald::Store::Log.new(dir: @dir, fsync: :never, lock_timeout: 5).tap { |s| (@stores ||= []) << s }
    assert_equal 2, Timeout.timeout(8) { append(store, "/a", "while it is stopped") }.message_id
  end

  # A holder that never lets go (stopped holding it, hung): an append waits lock_timeout, warns on the way,
  # then raises TimeoutError naming the holder's pid, and writes nothing. Once the holder is gone, it writes.
  def test_a_lock_never_given_up_is_a_timeout_naming_its_holder_not_a_hang
    store = Herald::Store::Log.new(dir: @dir, fsync: :never, lock_timeout: 1.3).tap { |s| (@stores ||= []) << s }
    # (it gets the lock once the store's listener dropped its lease)
    pid = sleeping_child { File.new(File.join(@dir, "LOCK"), File::RDWR).flock(File::LOCK_EX) }
    log = capture_log do
      error = assert_raises(Herald::TimeoutError) { Timeout.timeout(10) { append(store, "/a", "x") } }
      assert_includes error.message, "held by pid #{pid}"
    end
    assert_includes log, "waiting for the log's write lock, held by pid #{pid}"
    kill_children
    assert_equal 1, append(store, "/a", "after").message_id
    assert_equal ["after"], open_store.backlog("/a", 0).map(&:data)
  end

  def test_lock_timeout_must_be_a_positive_number
    [0, -1, "5", nil].each do |bad|
      assert_raises(Herald::InvalidArgumentError, bad.inspect) { Herald::Store::Log.new(dir: @dir, lock_timeout: bad) }
    end
  end

  private

  # Forks a child that runs the block, says so, and sleeps until killed (teardown); its pid once it said so.
  def sleeping_child
    r, w = IO.pipe
    pid = fork do
      r.close
      yield
      w.puts "done"
      sleep
    end
    (@children ||= []) << pid
    w.close
    assert_equal "done", Timeout.timeout(10) { r.gets }&.chomp
    pid
  ensure
    r&.close
  end

  def kill_children
    @children&.each do |pid|
      Process.kill(:KILL, pid)
      Process.wait(pid)
    end
    @children = nil
  end

  def capture_log
    out = StringIO.new
    previous = Herald.logger
    Herald.logger = Logger.new(out)
    yield
    out.string
  ensure
    Herald.logger = previous
  end

  def open_store = Herald::Store::Log.new(dir: @dir, fsync: :never, max_backlog_size: 100_000).tap { |s| (@stores ||= []) << s }

  def append(store, channel, data) = store.append(channel, json_codec.encode(data), codec: json_codec)
end
