# frozen_string_literal: true

require_relative "dashboard_helper"
require "herald/server"

# `herald server`'s demo mounts the dashboard at /herald, on the server's bus.
class DemoMountTest < Minitest::Test
  include Herald::DashboardTestSupport

  def test_the_demo_app_serves_the_dashboard_at_herald
    bus = Herald::Bus.new(store: log_store)
    bus.publish("/chat", {"text" => "hi"})
    demo = Herald::Server::DemoApp.new(bus: bus)
    status, _, body = demo.call(::Rack::MockRequest.env_for("/herald/channels"))
    assert_equal 200, status
    text = body.join
    assert_includes text, "href=\"/herald/channel?name=%2Fchat\""
    assert_includes text, "href=\"/herald/dead\""
    assert_equal "/herald/subscribers", demo.call(::Rack::MockRequest.env_for("/herald"))[1]["location"]
    assert_equal 404, demo.call(::Rack::MockRequest.env_for("/heraldx"))[0]
  ensure
    bus&.close
  end
end
