# frozen_string_literal: true

module Herald
  # A codec turns a message's data into bytes once, at publish, and back on first read.
  #
  # The plug-in interface, implemented by Codec::Json and Codec::Msgpack:
  #   codec.id            => Integer 0..255, stored with every record so any reader can decode it
  #   codec.name          => Symbol (:json, :msgpack)
  #   codec.content_type  => String, the MIME type of the encoded bytes
  #   codec.encode(obj)   => frozen String
  #   codec.decode(bytes) => Ruby object (JSON semantics: string keys)
  module Codec
    REGISTRY = {}
    BY_ID = []

    def self.register(codec)
      REGISTRY[codec.name] = codec
      BY_ID[codec.id] = codec
    end

    # Accepts a name (:json), a codec object, or a stored codec id.
    def self.fetch(name_or_codec)
      case name_or_codec
      when Symbol, String
        REGISTRY.fetch(name_or_codec.to_sym) do
          raise InvalidArgumentError, "Unknown codec #{name_or_codec.inspect}, expected one of #{REGISTRY.keys.inspect}"
        end
      when Integer
        BY_ID[name_or_codec] || raise(CorruptRecordError, "unknown codec id #{name_or_codec}")
      else
        name_or_codec
      end
    end
  end
end
