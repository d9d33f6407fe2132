# frozen_string_literal: true

require "msgpack"

module Herald
  module Codec
    # The codec of events: MessagePack with three extension types, so an event comes back as the
    # object that was published, not as a Hash:
    #   ext 0  Symbol
    #   ext 1  Struct (keyword_init or positional, nested too): class name, then its values in member order
    #   ext -1 Time (msgpack's timestamp format)
    # Hashes, Arrays, Strings, numbers, true/false/nil are plain MessagePack.
    #
    # Decoding looks the class up by name; a name this process does not know raises
    # Herald::UnknownEventClassError. A Struct is rebuilt with `allocate` and `[]=` (as Marshal does:
    # its initialize does not run). Decoded strings, arrays and hashes are frozen: an event is a fact.
    #
    # Packers and unpackers are reused per thread: encoding an event allocates its bytes, decoding it
    # the Struct and its non-interned values.
    module Event
      STRUCT_TYPE = 1

      def self.id = 3

      def self.name = :event

      def self.content_type = "application/vnd.herald-event+msgpack"

      def self.encode(obj)
        packer = Thread.current[:herald_event_packer] ||= FACTORY.packer
        packer.write(obj)
        packer.to_s.freeze
      rescue NoMethodError, RangeError => e # RangeError: an Integer beyond 64 bits
        raise EventEncodingError, "cannot encode #{obj.class} as an event (#{e.message}): publish a Struct, " \
          "a Hash, or plain values (String, Integer, Float, Symbol, Time, Array, true/false/nil)"
      ensure
        packer&.reset
      end

      def self.decode(bytes)
        unpacker = Thread.current[:herald_event_unpacker] ||= FACTORY.unpacker(freeze: true)
        unpacker.feed(bytes)
        unpacker.read
      ensure
        unpacker&.reset
      end

      # The class named in an event, loaded by name once and cached.
      def self.event_class(name)
        CLASSES[name] || (CLASSES[name] = Object.const_get(name))
      rescue NameError
        raise UnknownEventClassError, "event class #{name} is not loaded in this process: require the file " \
          "defining it before the subscribers' workers start"
      end

      def self.pack_struct(struct, packer)
        name = struct.class.name or
          raise EventEncodingError, "#{struct.class.inspect} is an anonymous Struct: assign it to a constant to publish it"
        packer.write(name)
        packer.write_array_header(struct.size)
        struct.each { |value| packer.write(value) }
      end

      def self.unpack_struct(unpacker)
        struct = event_class(unpacker.read).allocate
        unpacker.read_array_header.times { |i| struct[i] = unpacker.read }
        struct
      end

      CLASSES = {}
      FACTORY = MessagePack::Factory.new
      FACTORY.register_type(0, Symbol)
      FACTORY.register_type(STRUCT_TYPE, Struct, packer: method(:pack_struct), unpacker: method(:unpack_struct), recursive: true)
      FACTORY.register_type(-1, Time, packer: MessagePack::Time::Packer, unpacker: MessagePack::Time::Unpacker)

      Codec.register(self)
    end
  end
end
