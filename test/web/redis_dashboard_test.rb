# frozen_string_literal: true

require_relative "dashboard_tests"

class RedisDashboardTest < Minitest::Test
  include Herald::DashboardTests

  def build_web_store
    Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: "web#{SecureRandom.hex(6)}", on_reset: ->(*) {})
  end

  def store_facts(body)
    assert_includes body, "redis"
    assert_includes body, store.namespace
  end
end
