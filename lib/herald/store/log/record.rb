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
      # as its codec says, so the same bytes and encodings come back (docs/log.md).
      module Record
        FRAME = "L<L<"
        FRAME_SIZE = 8
        IDS = "Q<Q<Q<" # global id, message id, word
        HEADER_SIZE = 48
        TARGETS_AT = 24 # offsets in the payload
        CREATED_AT = 28
        RETENTION_AT = 36
        # length, CRC (patched in after), header, channel, site, targets, data, and a byte dropped after
        LAYOUT = "@0L<L<Q<Q<Q<L<EL<Ea*a*a*a*x"
        # The same with constant_parts: length, CRC, ids, head (word, targets length), created_at, tail (retention,
        # channel), data, a byte dropped after; CONSTANT_SIZE is the payload's length without tail and data.
        CONSTANT_LAYOUT = "@0L<L<Q<Q<a*Ea*a*x"
        CONSTANT_SIZE = 36
        # A length beyond this is damage, not a record (records this big do not belong on a message bus).
        # Publish refuses data over Limits::MAX_PAYLOAD_BYTES (240 MiB) and targets over MAX_TARGETS_BYTES
        # (8 MiB), and channel and site id are shorter than 64 KiB each, so every record written fits
        # (test/store/log/record_test.rb checks the sum). Never lowered: logs written before must still read.
        MAX_PAYLOAD = 256 * 1024 * 1024
        RETENTION = "L<E"
        FLAGS_AT = FRAME_SIZE + 17
        HAS_RETENTION = 1
        HAS_SITE = 2 # a site id is present, even an empty one: "" is a site of its own, never "no site"
        EMPTY = "".b.freeze
        TEXT_CODECS = [Codec::Json.id].freeze

        module_function

        # Builds the whole frame into `buffer` and returns it: one pack of every field and piece, then the
        # CRC of the payload patched in. "a*" copies a string's bytes whatever its encoding (a `<<` of UTF-8
        # text onto binary bytes raises, or makes Ruby check both strings' encodings). "@0" starts at the
        # buffer's beginning without freeing its memory, where `clear` freed it and every pack grew it
        # again; the trailing "x" byte (dropped after) makes the CRC's slice a copy, not a view that would
        # share the buffer (a shared string cannot be cut back by "@0": it is cleared then). Record encoding
        # cost a third of a publish's instructions with two packs, a scratch header per thread and four CRC calls.
        def encode(buffer, global_id, message_id, channel, site_id, payload, codec_id, created_at,
          targets, max_size, max_age)
          site = site_id ? site_id.to_s : EMPTY
          targets = targets ? MessagePack.pack(targets) : EMPTY
          channel_bytes = channel.bytesize
          site_bytes = site.bytesize
          targets_bytes = targets.bytesize
          raise InvalidMessageError, "channel and site_id must be shorter than 64 KiB" if channel_bytes > 0xffff || site_bytes > 0xffff
          length = HEADER_SIZE + channel_bytes + site_bytes + targets_bytes + payload.bytesize
          flags = ((max_size || max_age) ? HAS_RETENTION : 0) | (site_id ? HAS_SITE : 0)
          short_targets = (targets_bytes < 0xffff) ? targets_bytes : 0xffff # 0xffff: read the u32 field
          word = codec_id | (flags << 8) | (channel_bytes << 16) | (site_bytes << 32) | (short_targets << 48)
          fields = [length, 0, global_id, message_id, word, targets_bytes, created_at, max_size || 0, max_age || 0.0,
            channel, site, targets, payload]
          seal(buffer, fields, LAYOUT, length)
        end

        # The bytes of a record without site and targets that stay the same from one publish on its channel to
        # the next (same codec and retention), packed once and kept by the channel (Log#append): the codec and
        # lengths word with the targets length, and the retention with the channel. => [head, tail]
        def constant_parts(channel, codec_id, max_size, max_age)
          raise InvalidMessageError, "channel and site_id must be shorter than 64 KiB" if channel.bytesize > 0xffff
          word = codec_id | (((max_size || max_age) ? HAS_RETENTION : 0) << 8) | (channel.bytesize << 16)
          [[word, 0].pack("Q<L<").freeze, [max_size || 0, max_age || 0.0, channel].pack("L<Ea*").freeze]
        end

        # As encode, for a record without site and targets, from its channel's constant_parts: the same bytes,
        # with five pack directives fewer and no lengths or flags to work out (a sixth of encode's instructions).
        def encode_constant(buffer, global_id, message_id, created_at, head, tail, payload)
          length = CONSTANT_SIZE + tail.bytesize + payload.bytesize
          seal(buffer, [length, 0, global_id, message_id, head, created_at, tail, payload], CONSTANT_LAYOUT, length)
        end

        # Packs `fields` into `buffer` with `layout` (ending in the byte "x"), then patches the payload's CRC in.
        def seal(buffer, fields, layout, length)
          begin
            fields.pack(layout, buffer: buffer)
          rescue RuntimeError # (not FrozenError) the buffer shares its bytes with a slice or a dup: "@0" cannot cut it
            raise if buffer.frozen?
            fields.pack(layout, buffer: buffer.clear)
          end
          crc = Zlib.crc32(buffer.byteslice(FRAME_SIZE, length))
          buffer.chop!
          buffer.setbyte(4, crc & 0xff)
          buffer.setbyte(5, (crc >> 8) & 0xff)
          buffer.setbyte(6, (crc >> 16) & 0xff)
          buffer.setbyte(7, crc >> 24)
          buffer
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
