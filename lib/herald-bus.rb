# frozen_string_literal: true

# The gem is named herald-bus (RubyGems' "herald" is another gem): Bundler.require loads this file.
require_relative "herald"
