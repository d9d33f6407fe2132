# frozen_string_literal: true

require_relative "../test_helper"
require_relative "contract"

class MemoryStoreTest < Minitest::Test
  include StoreContract

  def build_store(**options) = Herald::Store::Memory.new(**options)
end
