# frozen_string_literal: true

require_relative "in_child"

# One publisher process, two subscriber processes, on each store, and the async adapter failing the same
# check: cross_process_cases.rb, in a child Ruby.
class CableCrossProcessSuiteTest < Minitest::Test
  include Herald::CableInChild

  def test_cross_process_cases = run_cases(File.join(__dir__, "cross_process_cases.rb"))
end
