# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/model/runner"

# Randomized, model-based tests of the stores: random operation sequences (publish with any text, binary,
# targets, sites and retention; backlog, last_id(s), global_backlog, subscribe, fork, reopen) run through
# Herald::Bus (JSON and MessagePack) against Store::Memory as the oracle and each other store, comparing
# every answer byte for byte and encoding for encoding. What the model allows to differ, and why, is in
# test/support/model/runner.rb.
#
#   SEED=123 STORE=log_always bundle exec ruby -Itest test/store/model_test.rb   # replay one seed
#   SEEDS=2 OPS=800 (per store, the defaults); bin/soak 600 runs longer, across every store.
class ModelTest < Minitest::Test
  SEEDS = Integer(ENV.fetch("SEEDS", "2"))
  OPS = Integer(ENV.fetch("OPS", "800"))
  SERVERS = {"redis" => :redis, "postgres" => :postgres}.freeze

  Herald::Model::Subject::NAMES.each do |name|
    next if ENV["STORE"] && ENV["STORE"] != name

    define_method(:"test_#{name}_answers_as_the_memory_oracle") do
      Herald::TestServers.require!(self, SERVERS[name]) if SERVERS[name]
      seeds = ENV["SEED"] ? [Integer(ENV["SEED"])] : Array.new(SEEDS) { Random.new_seed % 1_000_000_000 }
      seeds.each do |seed|
        runner = Herald::Model::Runner.new(name, seed: seed, ops: OPS)
        runner.run
        assert_equal OPS, runner.ops_run, "seed #{seed}: #{runner.replay_command}"
      end
    end
  end
end
