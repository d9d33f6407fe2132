# frozen_string_literal: true

require "test_helper"
require "open3"

# Herald::TestHelper under RSpec: runs spec/ (rspec-core from the bundle) in a child Ruby, so the minitest
# suite, and with it CI, fails when the RSpec side does. SEED=N replays an order.
class RSpecSuiteTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def test_the_rspec_suite_passes
    seed = ENV.fetch("SEED", rand(100_000).to_s)
    rspec = Gem.bin_path("rspec-core", "rspec")
    out, status = Open3.capture2e(RbConfig.ruby, rspec, "--seed", seed, "--no-color", chdir: ROOT)
    assert status.success?, "rspec --seed #{seed} failed:\n#{out}"
    examples = out[/(\d+) examples?, 0 failures/, 1]
    assert examples, out
    assert_operator examples.to_i, :>=, 12, out
  end
end
