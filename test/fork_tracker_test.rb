# frozen_string_literal: true

require_relative "test_helper"

class ForkTrackerTest < Minitest::Test
  def test_after_fork_callbacks_run_in_the_child_and_the_pid_is_refreshed
    r, w = IO.pipe
    hook = Herald::ForkTracker.after_fork { w.puts "hook #{Process.pid}" }
    pid = fork do
      w.puts "pid #{Herald::ForkTracker.pid} #{Process.pid}"
      exit!(0)
    end
    Process.wait(pid)
    w.close
    lines = r.read.lines.map(&:split)
    assert_equal [["hook", pid.to_s], ["pid", pid.to_s, pid.to_s]], lines
    assert_equal Process.pid, Herald::ForkTracker.pid
  ensure
    Herald::ForkTracker.remove(hook)
  end

  def test_removed_callbacks_do_not_run
    r, w = IO.pipe
    hook = Herald::ForkTracker.after_fork { w.puts "hook" }
    Herald::ForkTracker.remove(hook)
    pid = fork { exit!(0) }
    Process.wait(pid)
    w.close
    assert_equal "", r.read
  end

  # Process.daemon forks through daemon(3), which Process._fork never sees. A Log store opened before it
  # must still reopen in the daemon: its group-commit thread did not survive the fork, so an :always
  # publish would wait forever on the parent's (dead) thread.
  def test_process_daemon_refreshes_the_pid_and_a_log_store_reopens
    Dir.mktmpdir("herald-daemon") do |dir|
      store = Herald::Store::Log.new(dir: dir, fsync: :always)
      store.append("/a", "1", codec: Herald::Codec::Json)
      r, w = IO.pipe
      pid = fork do
        Process.daemon(true, true)
        w.puts "pid #{Herald::ForkTracker.pid} #{Process.pid}"
        w.flush
        Timeout.timeout(5) { store.append("/a", "2", codec: Herald::Codec::Json) }
        w.puts "published #{store.last_id("/a")}"
      rescue Exception => e # standard:disable Lint/RescueException
        w.puts "failed #{e.class}"
      ensure
        w.close
        exit!(0)
      end
      Process.wait(pid)
      w.close
      lines = Timeout.timeout(10) { r.read }.lines.map(&:split)
      assert_equal "pid", lines[0][0]
      assert_equal lines[0][2], lines[0][1], "ForkTracker.pid in the daemon"
      assert_equal ["published", "2"], lines[1]
      store.close
    end
  end
end
