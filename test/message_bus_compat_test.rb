# frozen_string_literal: true

require_relative "test_helper"
require_relative "message_bus_compat/run"
require "stringio"

# message_bus 4.5.1's own specs, unedited, against Herald's drop-in and against message_bus itself. Each run is
# a child process: `require "herald/message_bus"` and the message_bus gem both define MessageBus, and other
# tests in this process load the gem.
class MessageBusCompatTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)

  def run_specs(target, backend = "memory")
    out = StringIO.new
    counts, unexpected = MessageBusCompat.run(target: target, backend: backend, out: out)
    puts out.string.lines.reject { |l| l.start_with?("passed") }.join
    [counts, unexpected, out.string]
  end

  def test_the_drop_in_passes_message_bus_specs_on_memory
    counts, unexpected, out = run_specs("dropin")
    assert_empty unexpected, out
    assert_operator counts[:passed], :>=, 93, out
    assert_equal MessageBusCompat.not_applicable_count("memory"), counts[:not_applicable], out
  end

  # Herald's embedded log (a fresh directory): here the fork spec runs too (message_bus skips it on memory).
  def test_the_drop_in_passes_message_bus_specs_on_the_embedded_log
    counts, unexpected, out = run_specs("dropin", "log")
    assert_empty unexpected, out
    assert_operator counts[:passed], :>=, 94, out
    assert_equal MessageBusCompat.not_applicable_count("log"), counts[:not_applicable], out
  end

  # On the real servers of test/support/servers.rb; reset! empties the store between specs as message_bus's does.
  %w[redis postgres].each do |backend|
    define_method(:"test_the_drop_in_passes_message_bus_specs_on_#{backend}") do
      Herald::TestServers.require!(self, backend.to_sym)
      counts, unexpected, out = run_specs("dropin", backend)
      assert_empty unexpected, out
      # PostgreSQL: three backend specs wait 100 ms for a new bus's first delivery (KNOWN_FAILING when they fail).
      assert_operator counts[:passed] + counts[:known_failing] + counts[:missed_window], :>=, (backend == "redis") ? 96 : 93, out
      assert_equal MessageBusCompat.not_applicable_count(backend), counts[:not_applicable], out
    end

    define_method(:"test_message_bus_passes_its_own_specs_on_#{backend}_through_the_harness") do
      Herald::TestServers.require!(self, backend.to_sym)
      counts, unexpected, out = run_specs("message_bus", backend)
      assert_empty unexpected, out
      assert_operator counts[:passed] + counts[:missed_window], :>=, 101, out
    end
  end

  # The harness is faithful: message_bus passes its own specs through it, the not-applicable ones included.
  def test_message_bus_passes_its_own_specs_through_the_harness
    counts, unexpected, out = run_specs("message_bus")
    assert_empty unexpected, out
    assert_equal 0, counts[:failed], out
    assert_operator counts[:passed], :>=, 100, out
  end

  # A Rails app written for message_bus, on the drop-in (MessageBus's Railtie wiring, a controller's and a
  # runner's MessageBus.publish reaching a poll through the app): in a child Ruby with the Rails gems the
  # Rails app test installs (vendor/rails-gems; RailsAppTest::RAILS for this Ruby), none of this bundle's.
  def test_a_rails_app_written_for_message_bus
    rails = (Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.2")) ? "8.1.4" : "7.2.4"
    gems = File.join(ENV.fetch("HERALD_RAILS_GEMS", File.join(ROOT, "vendor", "rails-gems")), "ruby-#{RbConfig::CONFIG["ruby_version"]}", rails)
    unless File.exist?(File.join(gems, "specifications", "railties-#{rails}.gemspec"))
      return skip("Rails #{rails} is not in #{gems}: test/rails/rails_app_test.rb installs it")
    end
    clean = ENV.to_h.select { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB].include?(k) }.transform_values { nil }
    env = clean.merge("GEM_HOME" => gems, "GEM_PATH" => gems, "RUBYLIB" => File.join(ROOT, "lib"))
    Dir.mktmpdir("mb-rails") do |root|
      out, status = Open3.capture2e(env, RbConfig.ruby, File.expand_path("message_bus_compat/rails_check.rb", __dir__), root)
      assert status.success?, out[-3000..] || out
      assert_includes out, "rails ok"
    end
  end

  # What the specs leave out: subscribe's return value, unsubscribe, Message's encoding, the middleware.
  def test_drop_in_api_in_a_child_process
    script = File.expand_path("message_bus_compat/api_check.rb", __dir__)
    out, status = Open3.capture2e(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), script)
    assert status.success?, out
    assert_includes out, "api ok"
  end
end
