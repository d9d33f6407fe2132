# frozen_string_literal: true

require "json"

module Herald
  module Codec
    # JSON text. The default: what browsers read, so the HTTP transport can splice it into responses as is.
    #
    # Strict: only what JSON can carry (Hash, Array, String in valid UTF-8 or convertible to it, and its
    # subclasses such as ActiveSupport::SafeBuffer, as the String they hold; Integer, Float except
    # NaN/Infinity, true, false, nil; Symbols become strings) is encoded. Anything else (an ActiveRecord
    # object, a Time, a Proc, invalid UTF-8) raises InvalidMessageError naming it, instead of being stored
    # as its `to_s` ("#<Signup:0x...>").
    #
    # Unless a `fallback` is set: a value strict JSON refuses (not bad text) is then encoded whole by
    # `fallback.encode(value)`. Under Rails the Railtie sets ActiveSupport::JSON, so Herald publishes what
    # ActionCable.server.broadcast sends: Times in ISO 8601, BigDecimals as strings, models as their
    # attributes, any object through its `as_json`. Plain data keeps the strict encoder's speed.
    module Json
      def self.id = 1

      def self.name = :json

      def self.content_type = "application/json"

      class << self
        # nil (refuse), or an object with #encode(value) => JSON String, e.g. ActiveSupport::JSON.
        attr_accessor :fallback
      end

      # Raised from the strict coder's hook for a value it cannot carry: the fallback's turn, or a refusal.
      class Unsupported < StandardError; end

      # One strict coder for every publish: `JSON.generate(obj, strict: true)` allocates its options each call.
      # Its block sees only what the strict generator does not write itself: String subclasses go as the
      # plain String they hold; text that is not UTF-8 is refused as it would be without the block.
      CODER = JSON::Coder.new(strict: true) do |value|
        raise Unsupported, "#{value.is_a?(Float) ? value : value.class} not allowed in JSON" unless value.is_a?(String)
        text = String.new(value)
        text = text.encode(Encoding::UTF_8) unless text.encoding == Encoding::UTF_8 # raises for bytes it cannot map
        raise JSON::GeneratorError, "source sequence is illegal/malformed utf-8" unless text.valid_encoding?
        text
      end

      def self.encode(obj)
        CODER.dump(obj).freeze
      rescue Unsupported => e
        fallback ? encode_with_fallback(obj) : refuse(obj, e)
      rescue JSON::JSONError, Encoding::UndefinedConversionError, Encoding::InvalidByteSequenceError => e
        refuse(obj, e)
      end

      def self.encode_with_fallback(obj)
        json = fallback.encode(obj)
        raise Unsupported, "#{fallback} returned #{json.class}, not JSON text" unless json.is_a?(String)
        json = String.new(json, encoding: Encoding::UTF_8)
        raise Unsupported, "#{fallback} returned invalid UTF-8" unless json.valid_encoding?
        json.freeze
      rescue Unsupported, JSON::JSONError, EncodingError, SystemStackError => e
        refuse(obj, e)
      end

      def self.refuse(obj, error)
        raise InvalidMessageError, "cannot encode #{obj.class} as JSON: #{error.message} (publish Hashes, Arrays, " \
          "UTF-8 Strings, numbers, true, false and nil; or use codec: :msgpack for binary Strings)"
      end
      private_class_method :encode_with_fallback, :refuse

      def self.decode(bytes)
        JSON.parse(bytes)
      end

      Codec.register(self)
    end
  end
end
