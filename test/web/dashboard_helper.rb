# frozen_string_literal: true

require_relative "../events/events_helper"
require_relative "../support/servers"
require "rack"
require "herald/web"

module Herald
  # Rack-level requests against Herald::Web mounted at /herald, with a cookie jar (the CSRF cookie).
  module DashboardTestSupport
    include EventsTestSupport

    NASTY = "/chat <script>alert('x')</script> é 🎉"

    def setup
      super
      Herald::Web.reset!
      @cookies = {}
    end

    def teardown
      Herald::Web.reset!
      super
    end

    # Rack::Lint checks every request and response against the Rack spec.
    def app = @app || ::Rack::Lint.new(Herald::Web)

    # => [status, headers, body String]
    def request(method, path, params: nil, headers: {}, cookies: true)
      query, = path.split("?", 2)
      env = ::Rack::MockRequest.env_for("/herald#{path}", method: method, params: params, **headers)
      env["SCRIPT_NAME"] = "/herald"
      env["PATH_INFO"] = query
      env["HTTP_COOKIE"] = @cookies.map { |k, v| "#{k}=#{v}" }.join("; ") if cookies && !@cookies.empty?
      status, h, body = app.call(env)
      text = +""
      body.each { |part| text << part }
      body.close if body.respond_to?(:close)
      if (set = h["set-cookie"])
        name, value = set.split(";").first.split("=", 2)
        @cookies[name] = value
      end
      [status, h, text.force_encoding(Encoding::UTF_8)]
    end

    def get(path, **options) = request("GET", path, **options)

    # A POST as the dashboard's forms send it: the CSRF token from a page first.
    def post(path, params = {}, token: true)
      get("/store") if token && @cookies.empty?
      params = params.merge("csrf" => @cookies[Web::Csrf::COOKIE]) if token
      request("POST", path, params: params)
    end

    def notice(response) = URI.decode_www_form(URI(response[1]["location"]).query.to_s).to_h["notice"]

    def assert_page(response, *texts)
      status, headers, body = response
      assert_equal 200, status, body[0, 500]
      assert_match %r{text/html}, headers["content-type"]
      texts.each { |t| assert_includes body, t }
      refute_includes body, "<script>alert", "user values are escaped"
      body
    end

    def bury(name, channel, error, data: {"n" => 1}, attempts: 3)
      msg = Herald.bus.store.append(channel, Codec::Json.encode(data), codec: Codec::Json)
      Events::DeadLetters.new(Herald.bus.store).bury(name, msg, error, attempts)
      msg
    end

    def boom(message = "boom <b>")
      raise ArgumentError, message
    rescue => e
      e
    end
  end
end
