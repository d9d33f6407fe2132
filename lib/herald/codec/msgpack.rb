# frozen_string_literal: true

require "msgpack"

module Herald
  module Codec
    # MessagePack bytes: smaller and faster than JSON for Ruby-to-Ruby traffic. Binary (ASCII-8BIT)
    # Strings travel as MessagePack bin and come back binary; other Strings come back as UTF-8.
    # What MessagePack cannot carry (an arbitrary object, a Time, an Integer beyond 64 bits) raises
    # InvalidMessageError naming it.
    module Msgpack
      def self.id = 2

      def self.name = :msgpack

      def self.content_type = "application/vnd.msgpack"

      def self.encode(obj)
        MessagePack.pack(obj).freeze
      rescue NoMethodError => e
        raise unless e.name == :to_msgpack
        where = e.receiver.instance_of?(obj.class) ? "" : " (in a #{obj.class})"
        raise InvalidMessageError, "cannot encode #{e.receiver.class} as MessagePack#{where}: " \
          "publish Hashes, Arrays, Strings, numbers, true, false and nil"
      rescue RangeError => e
        raise InvalidMessageError, "cannot encode #{obj.class} as MessagePack: #{e.message}"
      end

      def self.decode(bytes)
        MessagePack.unpack(bytes)
      end

      Codec.register(self)
    end
  end
end
