# frozen_string_literal: true

require "test_helper"
require "open3"

# The default store is closed when the process that opened it exits normally: a Log store left open makes
# the next process skip a whole reservation of ids (1,024 and more), so ids stop being dense.
class CloseAtExitTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  def setup = @dir = Dir.mktmpdir("herald-exit")

  def teardown = FileUtils.rm_rf(@dir)

  # Runs `code` in a fresh Ruby with HERALD_DIR set; returns its stdout lines. Fails on a non-zero exit.
  def ruby(code)
    out, err, status = Open3.capture3({"HERALD_DIR" => @dir}, RbConfig.ruby, "-I", LIB, "-e", "require 'herald'\n#{code}")
    assert status.success?, "#{code}\n#{out}#{err}"
    refute_match(/without closing/, err, "the previous process left the store open")
    out.lines.map(&:chomp)
  end

  def test_ids_stay_dense_across_processes_that_exit_normally
    assert_equal ["1 1"], ruby(%(id = Herald.publish("/chat", {"t" => "héllo 👋"}); puts "\#{id} \#{Herald.bus.store.last_global_id}"))
    assert_equal ["2 2"], ruby(%(id = Herald.publish("/chat", "a\\u0000b"); puts "\#{id} \#{Herald.bus.store.last_global_id}"))
    # Exiting by an exception is a normal exit for at_exit too.
    _, _, status = Open3.capture3({"HERALD_DIR" => @dir}, RbConfig.ruby, "-I", LIB, "-e", "require 'herald'; Herald.publish('/chat', ''); raise 'boom'")
    refute status.success?
    assert_equal ["4 /chat"], ruby(%(m = Herald.bus.publish_message("/chat", "after"); puts "\#{m.global_id} \#{m.channel}"))
  end

  # A forked child inherits the bus and its exit hook, but only the parent, which opened it, closes it.
  def test_a_forked_child_leaves_the_store_to_the_parent
    out = ruby(<<~RUBY)
      parent = Process.pid
      # Registered before the bus opens, so it runs after Herald's hook: in the child, the bus is still the
      # inherited one (not closed and forgotten).
      at_exit { puts "child kept the bus: \#{Herald.bus.equal?($bus)}" unless Process.pid == parent }
      Herald.publish("/chat", 1)
      $bus = Herald.bus
      pid = fork { Herald.publish("/chat", 2) } # the child exits normally, running the exit hooks
      Process.wait(pid)
      raise "child failed" unless $?.success?
      puts Herald.publish("/chat", 3)
    RUBY
    assert_equal ["child kept the bus: true", "3"], out
    assert_equal ["4"], ruby(%(puts Herald.publish("/chat", 4)))
  end

  def test_deferred_workers_stop_and_a_late_exit_hook_can_still_publish
    out = ruby(<<~RUBY)
      at_exit { puts "late \#{Herald.publish("/late", "from an earlier hook")}" } # runs after Herald's
      class Slow
        include Herald::Subscriber
        subscribe_to "/jobs"
        deferred
        def call(event, _) = puts("handled \#{event}")
      end
      Herald.start_workers
      Herald.publish_event({"n" => 1}, channel: "/jobs")
    RUBY
    assert_includes out, "late 1"
    ids = ruby(%(puts Herald.global_backlog(0).map(&:global_id).inspect; puts Herald.bus.publish_message("/after", 1).global_id))
    assert_equal ["[1, 2]", "3"], ids, "dense: the event, the late publish, then this one"
  end
end
