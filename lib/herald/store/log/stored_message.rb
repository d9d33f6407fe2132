# frozen_string_literal: true

module Herald
  module Store
    class Log
      # A Message read from the log: built with one short `unpack` of the three words that start every
      # record (ids, and codec + lengths packed in one word); the time, channel, site, targets and payload
      # are read out of the buffer when first asked for, so a poll that forwards bytes never builds the
      # targets, and nobody builds data they do not read. Lazy fields are computed idempotently, so
      # concurrent first reads agree.
      class StoredMessage < Message
        include Herald::Message::LazyTargets

        NO_TARGETS = [nil, nil, nil].freeze
        JSON_ID = Codec::Json.id

        def initialize(buffer, pos, length, names = nil)
          @buffer = buffer
          @start = pos + Record::FRAME_SIZE
          @length = length
          @names = names
          @global_id, @message_id, @word = buffer.unpack(Record::IDS, offset: @start)
        end

        def codec = @codec ||= Codec.fetch(@word & 0xff)

        def created_at = @created_at ||= @buffer.unpack1("E", offset: @start + Record::CREATED_AT)

        def channel
          @channel ||= begin
            name = @buffer.byteslice(@start + Record::HEADER_SIZE, (@word >> 16) & 0xffff).force_encoding(Encoding::UTF_8)
            @names ? (@names[name] ||= name.freeze) : name.freeze
          end
        end

        # nil when published without a site; "" (HAS_SITE with no bytes) is a site of its own.
        def site_id
          return nil if (@word >> 8).nobits?(Record::HAS_SITE) && site_length.zero?
          @site_id ||= @buffer.byteslice(@start + Record::HEADER_SIZE + channel_length, site_length)
            .force_encoding(Encoding::UTF_8).freeze
        end

        def payload
          @payload ||= begin
            word = @word
            skip = Record::HEADER_SIZE + ((word >> 16) & 0xffff) + ((word >> 32) & 0xffff) + targets_length
            bytes = @buffer.byteslice(@start + skip, @length - skip)
            bytes.force_encoding(Encoding::UTF_8) if (word & 0xff) == JSON_ID
            bytes.freeze
          end
        end

        private

        def channel_length = (@word >> 16) & 0xffff

        def site_length = (@word >> 32) & 0xffff

        def targets_length
          short = @word >> 48
          (short == 0xffff) ? @buffer.unpack1("L<", offset: @start + Record::TARGETS_AT) : short
        end

        def unpacked_targets
          @targets ||= if targets_length.zero?
            NO_TARGETS
          else
            MessagePack.unpack(@buffer.byteslice(@start + Record::HEADER_SIZE + channel_length + site_length, targets_length)).freeze
          end
        end
      end
    end
  end
end
