# frozen_string_literal: true

require_relative "../../test_helper"

# Several processes on one log directory: forked writers, cross-process wakeups, a store used across fork.
class LogProcessesTest < Minitest::Test
  PER_WRITER = 10_000

  def setup
    @dir = Dir.mktmpdir("herald-procs")
  end

  def teardown
    @stores&.each(&:close) # a store left open keeps polling its deleted directory, and says so
    FileUtils.rm_rf(@dir)
  end

  def test_two_forked_writers_share_one_directory
    assert_writers_share_the_log(2)
  end

  def test_four_forked_writers_share_one_directory
    assert_writers_share_the_log(4)
  end

  # Tiny segments and backlogs: writers roll and delete segments under each other's feet, a reader follows.
  def test_writers_rolling_and_deleting_segments_while_a_reader_follows
    options = {segment_bytes: 2048, max_backlog_size: 20}
    pids = 3.times.map do |w|
      fork do
        store = open_store(**options)
        2000.times { |i| append(store, "/c#{i % 2}", [w, i]) }
        store.close
        exit!(0)
      end
    end
    reader = open_store(**options)
    seen = []
    until pids.empty?
      pids.reject! { |pid| Process.waitpid(pid, Process::WNOHANG) }
      reader.wait(seen.last || 0, timeout: 0.1)
      seen.concat(reader.global_backlog(seen.last || 0).map(&:global_id))
    end
    eventually { reader.last_global_id == 6000 }
    assert_equal seen.uniq.sort, seen, "the reader saw ids in order, once each"
    fresh = open_store(**options)
    assert_equal [6000, 3000, 3000, 20], [fresh.last_global_id, fresh.last_id("/c0"), fresh.last_id("/c1"), fresh.backlog("/c0", 0).size]
    assert_operator Dir[File.join(@dir, "*.log")].size, :<, 10, "old segments deleted"
    assert_empty fresh.corrupt_records
  end

  def test_a_waiter_in_another_process_wakes_within_milliseconds
    reader = open_store
    go_r, go_w = IO.pipe
    pid = fork do
      go_w.close
      writer = open_store
      go_r.read(1) # publish once the parent is waiting
      sleep 0.05
      Process.clock_gettime(Process::CLOCK_REALTIME).then { |at| append(writer, "/wake", at) }
      writer.close
      exit!(0)
    end
    go_r.close
    latencies = []
    waiter = Thread.new do
      reader.wait(0, timeout: 5)
      latencies << Process.clock_gettime(Process::CLOCK_REALTIME) - reader.global_backlog(0).first.data
    end
    sleep 0.3 # the writer's peer list includes this store's socket
    go_w.write("x")
    go_w.close
    waiter.join
    Process.wait(pid)
    assert_operator latencies.first, :<, 0.2, "woken #{(latencies.first * 1000).round(1)} ms after the append"
  end

  def test_a_store_opened_before_fork_works_in_the_child
    store = open_store
    append(store, "/f", "parent")
    r, w = IO.pipe
    pid = fork do
      r.close
      msg = append(store, "/f", "child")
      w.puts [msg.global_id, msg.message_id, store.backlog("/f", 0).map(&:data).join(",")].join(" ")
      store.close
      exit!(0)
    end
    w.close
    line = r.read
    Process.wait(pid)
    assert_equal "2 2 parent,child", line.strip
    assert_equal 3, append(store, "/f", "parent again").global_id
    assert_equal %w[parent child], eventually { store.backlog("/f", 0).first(2).map(&:data).then { |d| d if d.size == 2 } }
  end

  def test_a_store_closed_before_fork_stays_closed_in_the_child
    store = open_store
    append(store, "/f", "before")
    store.close
    r, w = IO.pipe
    pid = fork do
      r.close
      begin
        append(store, "/f", "child")
        w.write("appended")
      rescue Herald::ClosedError
        w.write("closed #{store.backlog("/f", 0).map(&:data).join(",")}")
      end
      exit!(0)
    end
    w.close
    out = r.read
    Process.wait(pid)
    assert_equal "closed before", out
  end

  private

  def open_store(**options) = Herald::Store::Log.new(dir: @dir, fsync: :never, max_backlog_size: 100_000, **options).tap { |s| (@stores ||= []) << s }

  def append(store, channel, data) = store.append(channel, json_codec.encode(data), codec: json_codec)

  def assert_writers_share_the_log(writers)
    pids = writers.times.map do |w|
      fork do
        store = open_store
        PER_WRITER.times { |i| append(store, "/c#{i % 3}", [w, i]) }
        store.close
        exit!(0)
      end
    end
    pids.each { |pid| assert Process.wait2(pid).last.success? }
    all = open_store.global_backlog(0)
    assert_equal writers * PER_WRITER, all.size
    globals = all.map(&:global_id)
    assert_equal (1..writers * PER_WRITER).to_a, globals, "global ids unique, increasing, in file order"
    all.group_by(&:channel).each_value do |msgs|
      assert_equal (1..msgs.size).to_a, msgs.map(&:message_id), "per-channel ids contiguous"
    end
    writers.times do |w|
      mine = all.map(&:data).select { |d| d[0] == w }.map(&:last)
      assert_equal (0...PER_WRITER).to_a, mine, "writer #{w}'s messages all present, in its order"
    end
  end
end
