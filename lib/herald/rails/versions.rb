# frozen_string_literal: true

module Herald
  module Rails
    # The oldest Rails minor test/rails/rails_app_test.rb proves (with the newest that runs on Ruby 3.1).
    MINIMUM_RAILS = "7.0"
    # ActiveSupport before 7.2 calls JSON.generate with quirks_mode:, an option json 3 removed: every cookie
    # session and JSON response then fails. herald-bus needs json >= 2.10, which lets Bundler pick json 3.
    JSON_3_RAILS = "7.2"

    # Raises ConfigurationError, at boot, for a Rails Herald is not tested with or a json that breaks it.
    def self.check_versions!(rails:, json:)
      rails = Gem::Version.new(rails)
      if rails < Gem::Version.new(MINIMUM_RAILS)
        raise ConfigurationError, "herald-bus needs Rails #{MINIMUM_RAILS} or later (this app has Rails #{rails})"
      end
      return unless rails < Gem::Version.new(JSON_3_RAILS) && Gem::Version.new(json) >= Gem::Version.new("3")
      raise ConfigurationError, "Rails #{rails} cannot run with json #{json} (its ActiveSupport passes quirks_mode:, " \
        "which json 3 removed): add gem \"json\", \"~> 2.10\" to your Gemfile"
    end
  end
end
