# frozen_string_literal: true

# The minitest-global_expectations gem only silences Minitest 5's warning about `obj.must_equal`; Minitest 5
# still defines those expectations on Object.
require "minitest/spec"
