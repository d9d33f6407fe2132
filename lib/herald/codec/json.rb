# frozen_string_literal: true

require "json"

module Herald
  module Codec
    # JSON text. The default: what browsers read, so the HTTP transport can splice it into responses as is.
    module Json
      def self.id = 1

      def self.name = :json

      def self.content_type = "application/json"

      def self.encode(obj)
        JSON.generate(obj).freeze
      end

      def self.decode(bytes)
        JSON.parse(bytes)
      end

      Codec.register(self)
    end
  end
end
