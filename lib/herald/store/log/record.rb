# frozen_string_literal: true

require "zlib"
require "msgpack"

module Herald
  module Store
    class Log
      # One record on disk: a frame (payload length, CRC32 of the payload) and a payload whose fixed-layout
      # header starts with the three 64-bit words a reader needs first, read with one short `unpack`:
      #
      #   frame   length u32 LE | crc32 u32 LE
      #   payload global_id u64 | message_id u64 |
      #           word u64 (codec id: bits 0-7, flags: 8-15 (HAS_RETENTION, HAS_SITE),
      #                     channel length: 16-31, site length: 32-47,
      #                     targets length: 48-63, 0xffff when it does not fit: read the u32) |
      #           targets length u32 | created_at f64 | max_backlog_size u32 (0: unset) |
      #           max_backlog_age f64 (0: unset) |
      #           channel | site_id | targets (MessagePack [user, group, client ids]) | data
      #
      # Decoding (StoredMessage) slices the rest out of the read buffer when first asked for, and leaves
      # data encoded: Message#data decodes it on first access.
      #
      # Bytes, not text: the record is built in a binary buffer, and every piece (channel, site, payload) is
      # appended as its bytes, whatever its encoding. Reading tags channel and site as UTF-8 and the payload
      # as its codec says, so the same bytes and encodings come back (DESIGN.md "Data: the same bytes out as in").
      module Record
        FRAME = "L<L<"
        FRAME_SIZE = 8
        IDS = "Q<Q<Q<" # global id, message id, word
        HEADER_SIZE = 48
        TARGETS_AT = 24 # offsets in the payload
        CREATED_AT = 28
        RETENTION_AT = 36
        HEADER_LAYOUT = "Q<Q<Q<L<EL<E"
        FRAME_LAYOUT = "L<L<a*a*a*a*a*" # length, CRC, header, channel, site, targets, data
        # A length beyond this is damage, not a record (records this big do not belong on a message bus).
        MAX_PAYLOAD = 256 * 1024 * 1024
        RETENTION = "L<E"
        FLAGS_AT = FRAME_SIZE + 17
        HAS_RETENTION = 1
        HAS_SITE = 2 # a site id is present, even an empty one: "" is a site of its own, never "no site"
        EMPTY = "".b.freeze
        TEXT_CODECS = [Codec::Json.id].freeze

        module_function

        # Builds the whole frame into `buffer` (cleared first) and returns it. The header is packed into a
        # scratch string of the thread's, the CRC summed over the pieces (header, channel, site, targets,
        # data), and the frame then packed whole with one more pack ("a*" copies bytes whatever a string's
        # encoding): no slice of the buffer, and no `<<` of UTF-8 text onto binary bytes, which made Ruby
        # check both strings' encodings (that and the byte-by-byte frame fields were a quarter of this
        # method's instructions). Each pack allocates the Hash of its `buffer:` keyword, nothing else.
        def encode(buffer, global_id, message_id, channel, site_id, payload, codec_id, created_at,
          targets, max_size, max_age)
          site = site_id ? site_id.to_s : EMPTY
          targets = targets ? MessagePack.pack(targets) : EMPTY
          raise ArgumentError, "channel and site_id must be shorter than 64 KiB" if channel.bytesize > 0xffff || site.bytesize > 0xffff
          length = HEADER_SIZE + channel.bytesize + site.bytesize + targets.bytesize + payload.bytesize
          flags = ((max_size || max_age) ? HAS_RETENTION : 0) | (site_id ? HAS_SITE : 0)
          short_targets = (targets.bytesize < 0xffff) ? targets.bytesize : 0xffff # 0xffff: read the u32 field
          word = codec_id | (flags << 8) | (channel.bytesize << 16) | (site.bytesize << 32) | (short_targets << 48)
          scratch = (Thread.current[:herald_record] ||= Scratch.new)
          header = scratch.header
          fields = scratch.fields
          fields[0] = global_id
          fields[1] = message_id
          fields[2] = word
          fields[3] = targets.bytesize
          fields[4] = created_at
          fields[5] = max_size || 0
          fields[6] = max_age || 0.0
          fields.pack(HEADER_LAYOUT, buffer: header.clear)
          crc = Zlib.crc32(channel, Zlib.crc32(header))
          crc = Zlib.crc32(targets, Zlib.crc32(site, crc)) unless site.empty? && targets.empty?
          frame = scratch.frame
          frame[0] = length
          frame[1] = Zlib.crc32(payload, crc)
          frame[2] = header
          frame[3] = channel
          frame[4] = site
          frame[5] = targets
          frame[6] = payload
          frame.pack(FRAME_LAYOUT, buffer: buffer.clear)
          frame[6] = nil # the data is the caller's: not kept alive by this thread
          buffer
        end

        # What encode packs, kept by each thread (Ruby's pack takes an Array: one allocation less each).
        Scratch = Struct.new(:header, :fields, :frame) do
          def initialize = super(String.new(capacity: HEADER_SIZE, encoding: Encoding::BINARY), Array.new(7), Array.new(7))
        end

        # What a frame at `pos` of `buffer` (holding bytes up to `limit`) is:
        #   Integer payload length when the record is whole and its CRC matches;
        #   :partial when the buffer ends inside it; :bad when it cannot be a record.
        def check(buffer, pos, limit)
          return :partial if pos + FRAME_SIZE > limit
          length, crc = buffer.unpack(FRAME, offset: pos)
          return :bad if length < HEADER_SIZE || length > MAX_PAYLOAD
          return :partial if pos + FRAME_SIZE + length > limit
          return :bad unless Zlib.crc32(buffer.byteslice(pos + FRAME_SIZE, length)) == crc
          length
        end

        # The Message in the (already checked) frame at `pos`: one unpack of the fixed header, the rest
        # sliced lazily (StoredMessage). `names` interns channel names, so a backlog shares one String.
        def decode(buffer, pos, length, names = nil) = StoredMessage.new(buffer, pos, length, names)

        # The retention the publisher asked for with this record: [max_backlog_size, max_backlog_age], or nil.
        def retention(buffer, pos)
          return nil if buffer.getbyte(pos + FLAGS_AT).nobits?(HAS_RETENTION)
          size, age = buffer.unpack(RETENTION, offset: pos + FRAME_SIZE + RETENTION_AT)
          [size.zero? ? nil : size, age.zero? ? nil : age]
        end
      end
    end
  end
end
