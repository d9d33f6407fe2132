# frozen_string_literal: true

# Herald::TestHelper under RSpec, as an app's spec suite uses it (run by test/rspec_test.rb, or
# `bundle exec rspec` here).
$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "herald/test_helper"

RSpec.configure do |config|
  config.include Herald::TestHelper
  config.disable_monkey_patching!
  config.order = :random
  Kernel.srand config.seed
end
