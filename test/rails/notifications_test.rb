# frozen_string_literal: true

require_relative "notifications_cases"

# The *.herald events through Herald's own callbacks, in this process (ActiveSupport not loaded) ...
class HeraldCallbackEventsTest < Minitest::Test
  include Herald::NotificationsCases

  def listen(&block) = Herald::Instrumentation.subscribe(&block)

  def unlisten(callback) = Herald::Instrumentation.unsubscribe(callback)

  def test_active_support_is_not_loaded_here
    refute defined?(ActiveSupport::Notifications), "the callback cases must not go through ActiveSupport"
  end

  # ... and the same cases through real ActiveSupport::Notifications, in a child Ruby (so that nothing
  # else in this suite runs with ActiveSupport loaded).
  def test_the_same_events_through_active_support_notifications
    root = File.expand_path("../..", __dir__)
    out, status = Open3.capture2e({"HERALD_WITH_AS" => "1"}, RbConfig.ruby, "-I", File.join(root, "lib"), "-I", File.join(root, "test"),
      File.join(__dir__, "notifications_cases.rb"), chdir: root)
    assert status.success?, out
    runs = out[/(\d+) runs, \d+ assertions, 0 failures, 0 errors, 0 skips/, 1].to_i
    assert_equal Herald::NotificationsCases.public_instance_methods.grep(/\Atest_/).size, runs, out
  end
end
