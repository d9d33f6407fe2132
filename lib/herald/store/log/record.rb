# frozen_string_literal: true

require "zlib"
require "msgpack"

module Herald
  module Store
    class Log
      # One record on disk: a frame (payload length, CRC32 of the payload) and a payload whose fixed-layout
      # header is read with a single `unpack`, followed by the variable parts:
      #
      #   frame   length u32 LE | crc32 u32 LE
      #   payload global_id u64 | message_id u64 | created_at f64 | max_backlog_size u32 (0: unset) |
      #           max_backlog_age f64 (0: unset) | codec id u8 | flags u8 | channel len u16 | site len u16 |
      #           targets len u32 | channel | site_id | targets (MessagePack [user, group, client ids]) | data
      #
      # Decoding slices the channel and the data out of the read buffer and leaves data encoded:
      # Message#data decodes it on first access.
      module Record
        FRAME = "L<L<"
        FRAME_SIZE = 8
        HEADER = "Q<Q<EL<ECCS<S<L<"
        HEADER_SIZE = 46
        LAYOUT = "L<L<Q<Q<EL<ECCS<S<L<" # frame + header, packed in one go at append
        # A length beyond this is damage, not a record (records this big do not belong on a message bus).
        MAX_PAYLOAD = 256 * 1024 * 1024
        RETENTION = "L<E"
        FLAGS_AT = FRAME_SIZE + 37
        HAS_RETENTION = 1
        EMPTY = "".b.freeze
        TEXT_CODECS = [Codec::Json.id].freeze

        module_function

        # Builds the whole frame into `buffer` (cleared first) and returns it.
        def encode(buffer, global_id, message_id, channel, site_id, payload, codec_id, created_at,
          targets, max_size, max_age)
          site = site_id ? site_id.to_s : EMPTY
          targets = targets ? MessagePack.pack(targets) : EMPTY
          length = HEADER_SIZE + channel.bytesize + site.bytesize + targets.bytesize + payload.bytesize
          buffer.clear
          flags = (max_size || max_age) ? HAS_RETENTION : 0
          [length, 0, global_id, message_id, created_at, max_size || 0, max_age || 0.0, codec_id, flags,
            channel.bytesize, site.bytesize, targets.bytesize].pack(LAYOUT, buffer: buffer)
          buffer << channel << site << targets << payload
          crc = Zlib.crc32(buffer.byteslice(FRAME_SIZE, length))
          4.times { |i| buffer.setbyte(4 + i, (crc >> (8 * i)) & 0xff) }
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

        # The Message in the (already checked) frame at `pos`. `names` interns channel names, so a
        # backlog of one channel shares one String.
        def decode(buffer, pos, length, names = nil)
          p = pos + FRAME_SIZE
          gid, mid, at, _size, _age, codec_id, _flags, clen, slen, tlen = buffer.unpack(HEADER, offset: p)
          p += HEADER_SIZE
          channel = buffer.byteslice(p, clen).force_encoding(Encoding::UTF_8)
          channel = (names[channel] ||= channel.freeze) if names
          site = buffer.byteslice(p + clen, slen).force_encoding(Encoding::UTF_8) if slen > 0
          targets = MessagePack.unpack(buffer.byteslice(p + clen + slen, tlen)) if tlen > 0
          start = p + clen + slen + tlen
          payload = buffer.byteslice(start, length - (start - pos - FRAME_SIZE))
          payload.force_encoding(Encoding::UTF_8) if TEXT_CODECS.include?(codec_id)
          Message.new(global_id: gid, message_id: mid, channel: channel, payload: payload.freeze,
            codec: Codec.fetch(codec_id), created_at: at, user_ids: targets&.[](0),
            group_ids: targets&.[](1), client_ids: targets&.[](2), site_id: site)
        end

        # The retention the publisher asked for with this record: [max_backlog_size, max_backlog_age], or nil.
        def retention(buffer, pos)
          return nil if buffer.getbyte(pos + FLAGS_AT).nobits?(HAS_RETENTION)
          size, age = buffer.unpack(RETENTION, offset: pos + FRAME_SIZE + 24)
          [size.zero? ? nil : size, age.zero? ? nil : age]
        end
      end
    end
  end
end
