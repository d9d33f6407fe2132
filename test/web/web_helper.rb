# frozen_string_literal: true

require_relative "../rack/rack_helper"
require_relative "../support/servers"
require "rack/mock"

module Herald
  module WebTestSupport
    include TestHelpers

    # The exposition parsed: {"name{label=\"v\"}" => Float}, every sample line once.
    def scrape(app)
      response = ::Rack::MockRequest.new(::Rack::Lint.new(app)).get("/")
      assert_equal 200, response.status, response.body
      assert_equal Web::Metrics::CONTENT_TYPE, response.headers["content-type"]
      samples = {}
      response.body.each_line do |line|
        next if line.start_with?("#")
        key, value = line.chomp.split(/ (?=\S+\z)/)
        refute samples.key?(key), "sample #{key} appears twice"
        samples[key] = Float(value)
      end
      samples
    end

    def health(app)
      response = ::Rack::MockRequest.new(::Rack::Lint.new(app)).get("/")
      [response.status, JSON.parse(response.body)]
    end
  end
end
