# frozen_string_literal: true

require_relative "../test_helper"
require "herald/rails/cable_config"
require "erb"
require "yaml"

# `rails g herald:install` sets `adapter: herald` in config/cable.yml (development and production), keeps
# channel_prefix and the test adapter, and leaves the old lines as comments that ERB does not run.
class CableConfigTest < Minitest::Test
  RAILS_7_2 = <<~YAML
    development:
      adapter: async

    test:
      adapter: test

    production:
      adapter: redis
      url: <%= ENV.fetch("REDIS_URL") %>
      channel_prefix: shop_production
  YAML

  RAILS_8 = <<~YAML
    # Async adapter only works within the same process, so for manually triggering cable updates from a console,
    # and seeing results in the browser, you must do so from the web console (running inside the dev process),
    # not a terminal started via bin/rails console! Add "console" to any action or any ERB template view
    # to make the web console appear.
    development:
      adapter: async

    test:
      adapter: test

    production:
      adapter: solid_cable
      connects_to:
        database:
          writing: cable
      polling_interval: 0.1.seconds
      message_retention: 1.day
  YAML

  def loaded(text) = YAML.safe_load(ERB.new(text).result, aliases: true)

  def test_rails_7_2s_cable_yml
    text = Herald::Rails::CableConfig.use_herald(RAILS_7_2)
    assert_equal({"development" => {"adapter" => "herald"}, "test" => {"adapter" => "test"},
                  "production" => {"adapter" => "herald", "channel_prefix" => "shop_production"}}, loaded(text))
    assert_includes text, %(  # url: <%%= ENV.fetch("REDIS_URL") %>\n), "the old line stays, its ERB escaped (no REDIS_URL needed)"
    assert_nil Herald::Rails::CableConfig.use_herald(text), "a second run changes nothing"
  end

  def test_rails_8s_solid_cable
    text = Herald::Rails::CableConfig.use_herald(RAILS_8)
    assert_equal({"development" => {"adapter" => "herald"}, "test" => {"adapter" => "test"}, "production" => {"adapter" => "herald"}}, loaded(text))
    assert text.start_with?("# Async adapter only works"), "comments before the sections stay"
    assert_includes text, "  # adapter: solid_cable\n  # connects_to:\n  # database:\n  # writing: cable\n"
  end

  def test_missing_environments_are_added_and_others_kept
    text = Herald::Rails::CableConfig.use_herald("test:\n  adapter: test\nstaging:\n  adapter: redis")
    assert_equal({"test" => {"adapter" => "test"}, "staging" => {"adapter" => "redis"},
                  "development" => {"adapter" => "herald"}, "production" => {"adapter" => "herald"}}, loaded(text))
  end
end
