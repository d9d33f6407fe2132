# frozen_string_literal: true

require_relative "in_child"

# Redis and PostgreSQL restarted mid-stream, and a stalled Redis: restart_cases.rb, in a child Ruby.
class CableRestartSuiteTest < Minitest::Test
  include Herald::CableInChild

  def test_restart_cases = run_cases(File.join(__dir__, "restart_cases.rb"))
end
