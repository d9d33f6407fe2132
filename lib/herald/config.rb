# frozen_string_literal: true

module Herald
  # Settings for the default bus behind the Herald facade. Frozen once the bus is built.
  class Config
    attr_accessor :store, :codec, :on_error

    class << self
      # The store used when Herald.configure named none, also after Herald.reset! (the Railtie sets
      # storage/herald/<env>, or memory in tests). nil: $HERALD_STORE, else the embedded log in $HERALD_DIR
      # or ./herald-data.
      attr_accessor :default_store
    end

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
      chosen = store || Config.default_store || ENV["HERALD_STORE"].then { |url| url unless url.to_s.empty? }
      case chosen
      when nil then Store::Log.new(dir: Store::Log.default_dir)
      when :memory then Store::Memory.new
      when String then Store.from_url(chosen)
      else chosen
      end
    end
  end
end
