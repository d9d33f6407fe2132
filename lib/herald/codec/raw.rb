# frozen_string_literal: true

module Herald
  module Codec
    # A String's bytes, kept as given: for payloads that are encoded already (ActionCable hands its adapter
    # JSON text, Turbo Streams HTML), stored once and read back byte for byte, with no second encoding (a
    # JSON string around JSON text escapes every quote and costs a parse per reader).
    #
    # Decoding tags the bytes UTF-8 when they are valid UTF-8 (what ActionCable broadcasts), ASCII-8BIT
    # otherwise, on every store: the encoding follows the bytes, not the store.
    module Raw
      def self.id = 4

      def self.name = :raw

      def self.content_type = "application/octet-stream"

      def self.encode(obj)
        raise InvalidMessageError, "the raw codec carries Strings, got #{obj.class}" unless obj.is_a?(String)
        obj.frozen? ? obj : obj.dup.freeze
      end

      def self.decode(bytes)
        text = (bytes.encoding == Encoding::UTF_8) ? bytes : bytes.dup.force_encoding(Encoding::UTF_8)
        text = text.b unless text.valid_encoding?
        text.frozen? ? text : text.freeze
      end

      Codec.register(self)
    end
  end
end
