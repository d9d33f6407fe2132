# frozen_string_literal: true

require "msgpack"

module Herald
  module Codec
    # MessagePack bytes: smaller and faster than JSON for Ruby-to-Ruby traffic.
    module Msgpack
      def self.id = 2

      def self.name = :msgpack

      def self.content_type = "application/vnd.msgpack"

      def self.encode(obj)
        MessagePack.pack(obj).freeze
      end

      def self.decode(bytes)
        MessagePack.unpack(bytes)
      end

      Codec.register(self)
    end
  end
end
