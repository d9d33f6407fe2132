# frozen_string_literal: true

module Herald
  module Model
    # One store seen through two buses (one per codec), as an app would use it: the oracle's side or the
    # subject's. Each bus carries a tracker (a subscription to every channel) recording the last global id
    # its dispatcher delivered, so the model knows when a fence message, and everything before it, went
    # through; errors its dispatchers report are kept for the model to fail on.
    class Side
      CODECS = %i[json msgpack].freeze

      attr_reader :store, :errors

      def initialize(store)
        @store = store
        @errors = []
        @seen = {}
        @buses = CODECS.to_h do |codec|
          bus = Bus.new(store: store, codec: codec, on_error: ->(e, msg) { @errors << "#{codec} bus, #{msg&.global_id}: #{e.class}: #{e.message}" })
          @seen[codec] = 0
          bus.subscribe { |msg| @seen[codec] = msg.global_id }
          [codec, bus]
        end
      end

      def bus(codec) = @buses.fetch(codec)

      def seen(codec) = @seen.fetch(codec)

      def close = @buses.each_value(&:close)
    end
  end
end
