# frozen_string_literal: true

require_relative "dashboard_tests"

class PostgresDashboardTest < Minitest::Test
  include Herald::DashboardTests

  def build_web_store
    Herald::Store::Postgres.new(url: Herald::TestServers.postgres_url, table: "web_#{SecureRandom.hex(5)}", on_reset: ->(*) {})
  end

  def store_facts(body)
    assert_includes body, "postgresql"
    assert_includes body, store.table
  end
end
