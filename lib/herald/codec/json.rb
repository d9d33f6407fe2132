# frozen_string_literal: true

require "json"

module Herald
  module Codec
    # JSON text. The default: what browsers read, so the HTTP transport can splice it into responses as is.
    #
    # Strict: only what JSON can carry (Hash, Array, String in valid UTF-8 or convertible to it, Integer,
    # Float except NaN/Infinity, true, false, nil; Symbols become strings) is encoded. Anything else (an
    # ActiveRecord object, a Time, a Proc, invalid UTF-8) raises InvalidMessageError naming it, instead
    # of being stored as its `to_s` ("#<Signup:0x...>"). Convert such values first (`as_json`, `iso8601`).
    module Json
      def self.id = 1

      def self.name = :json

      def self.content_type = "application/json"

      # One strict coder for every publish: `JSON.generate(obj, strict: true)` allocates its options each call.
      CODER = JSON::Coder.new(strict: true)

      def self.encode(obj)
        CODER.dump(obj).freeze
      rescue JSON::JSONError, Encoding::UndefinedConversionError, Encoding::InvalidByteSequenceError => e
        raise InvalidMessageError, "cannot encode #{obj.class} as JSON: #{e.message} (publish Hashes, Arrays, " \
          "UTF-8 Strings, numbers, true, false and nil; or use codec: :msgpack for binary Strings)"
      end

      def self.decode(bytes)
        JSON.parse(bytes)
      end

      Codec.register(self)
    end
  end
end
