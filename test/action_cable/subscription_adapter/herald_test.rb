# frozen_string_literal: true

require_relative "../in_child"

# Rails' own adapter suite on `adapter: herald` over the log, Redis and PostgreSQL, and the adapter's own
# cases (payloads byte for byte up to 10 MB, the namespace, settings): herald_cases.rb, in a child Ruby.
class HeraldCableAdapterSuiteTest < Minitest::Test
  include Herald::CableInChild

  def test_rails_adapter_suite_and_herald_cases
    summary = run_cases(File.join(__dir__, "herald_cases.rb"))
    assert_operator summary[/\d+/].to_i, :>=, 27 + 10, "Rails' 9 cases on 3 stores and the adapter's own ran"
  end
end
