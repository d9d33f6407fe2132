# frozen_string_literal: true

require_relative "test_helper"

class HeraldFacadeTest < Minitest::Test
  def teardown
    Herald.reset!
  end

  def test_configure_then_use_the_default_bus
    store = Herald::Store::Memory.new
    Herald.configure do |c|
      c.store = store
      c.codec = :msgpack
    end
    assert_equal 1, Herald.publish("/a", {"x" => 1})
    assert_equal 1, Herald.last_id("/a")
    assert_equal [{"x" => 1}], Herald.backlog("/a").map(&:data)
    assert_same store, Herald.bus.store
    assert_equal Herald::Codec::Msgpack, Herald.bus.codec
  end

  def test_configure_after_start_is_refused
    Herald.configure { |c| c.store = :memory }
    Herald.publish("/a", 1)
    assert_raises(Herald::ConfigurationError) { Herald.configure { |c| c.codec = :json } }
  end
end
