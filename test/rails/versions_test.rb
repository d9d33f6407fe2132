# frozen_string_literal: true

require "test_helper"
require "herald/rails/versions"

# What the Railtie checks when it loads (test/rails/rails_app_test.rb runs Rails 7.0 and 7.2 for real).
class RailsVersionsTest < Minitest::Test
  def check(rails, json) = Herald::Rails.check_versions!(rails: rails, json: json)

  def test_supported_rails_and_json_pass
    assert_nil check("7.2.4", "3.1.0")
    assert_nil check("7.0.10", "2.15.2")
    assert_nil check("7.1.6", "2.10.0")
  end

  def test_rails_older_than_the_floor_is_refused
    error = assert_raises(Herald::ConfigurationError) { check("6.1.7.10", "2.15.2") }
    assert_equal "herald-bus needs Rails 7.0 or later (this app has Rails 6.1.7.10)", error.message
  end

  def test_json_3_under_rails_before_7_2_names_the_pin
    [["7.0.10", "3.1.0"], ["7.1.6", "3.0.0"]].each do |rails, json|
      error = assert_raises(Herald::ConfigurationError) { check(rails, json) }
      assert_includes error.message, "Rails #{rails} cannot run with json #{json}"
      assert_includes error.message, 'add gem "json", "~> 2.10" to your Gemfile'
    end
  end
end
