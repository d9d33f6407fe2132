# frozen_string_literal: true

require_relative "dashboard_tests"

class LogDashboardTest < Minitest::Test
  include Herald::DashboardTests

  def build_web_store = log_store

  def store_facts(body)
    %w[segments fsync free\ disk\ bytes write\ lease].each { |fact| assert_includes body, fact }
    assert_includes body, File.expand_path(store.dir)
  end
end
