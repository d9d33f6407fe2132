# frozen_string_literal: true

module Herald
  # Settings for the default bus behind the Herald facade. Frozen once the bus is built.
  class Config
    attr_accessor :store, :codec, :on_error

    def initialize
      @store = nil # a store object; nil means the embedded log in ENV["HERALD_DIR"] or ./herald-data
      @codec = :json
      @on_error = nil
    end

    def build_bus
      Bus.new(store: resolve_store, codec: codec, on_error: on_error)
    end

    private

    def resolve_store
      case store
      when nil then Store::Log.new(dir: Store::Log.default_dir)
      when :memory then Store::Memory.new
      when String then Store.from_url(store)
      else store
      end
    end
  end
end
