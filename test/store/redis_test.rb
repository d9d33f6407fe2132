# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
require_relative "contract"

class RedisStoreTest < Minitest::Test
  include StoreContract

  def build_store(**options)
    Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: "t#{SecureRandom.hex(6)}", **options)
  end
end
