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
end
