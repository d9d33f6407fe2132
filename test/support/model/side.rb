# frozen_string_literal: true

module Herald
  module Model
    # One store seen through two buses (one per codec), as an app would use it: the oracle's side or the
    # subject's. Errors the buses' dispatchers report are kept for the model to fail on.
    class Side
      CODECS = %i[json msgpack].freeze

      attr_reader :store, :errors

      def initialize(store)
        @store = store
        @errors = []
        @buses = CODECS.to_h do |codec|
          bus = Bus.new(store: store, codec: codec, on_error: ->(e, msg) { @errors << "#{codec} bus, #{msg&.global_id}: #{e.class}: #{e.message}" })
          [codec, bus]
        end
      end

      def bus(codec) = @buses.fetch(codec)

      def close = @buses.each_value(&:close)
    end
  end
end
