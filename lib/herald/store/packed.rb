# frozen_string_literal: true

require "msgpack"

module Herald
  module Store
    # The bytes the networked stores (Redis, PostgreSQL) keep for one message: one binary string,
    # so a backlog read is one round trip returning raw strings, and decoding a record is one unpack.
    #
    #   global_id  G  \ written by the server (Lua struct.pack(">dd") / float8send): doubles are exact
    #   message_id G  / up to 2**53, which JavaScript clients need anyway
    #   created_at G     Float seconds
    #   expires_at G     created_at + the channel's max_backlog_age at append
    #   codec id   C
    #   channel, site_id, targets lengths  N N N  (site length 0xFFFFFFFF means nil; targets are
    #                                             msgpack [user_ids, group_ids, client_ids], or empty)
    #   channel, site_id, targets, payload bytes
    #
    # The client builds everything after the two ids (the "tail"); the server prepends the ids.
    module Packed
      HEADER = "GGGGCNNN"
      HEADER_SIZE = 45
      NO_SITE = 0xFFFFFFFF
      TAIL_FORMAT = "GGCNNNa*a*a*a*"
      EMPTY = "".b.freeze

      # `targets`: Limits.pack_targets, checked and packed before anything else of the publish is done.
      def self.tail(channel, payload, codec, created_at, max_age, site_id, targets)
        [created_at, created_at + max_age, codec.id, channel.bytesize, site_id ? site_id.bytesize : NO_SITE,
          targets.bytesize, channel, site_id || EMPTY, targets, payload].pack(TAIL_FORMAT)
      end

      # Every record as a lazy Message (expired ones too: callers filter, caches keep them all).
      # `channel` (the name a backlog was read with) is shared by its messages: tagged UTF-8 as stored.
      def self.decode_all(records, channel = nil)
        channel = channel.dup.force_encoding(Encoding::UTF_8).freeze if channel && channel.encoding != Encoding::UTF_8
        records.map! { |r| Message.new(r, channel) }
      end

      def self.unexpired(messages, now = Process.clock_gettime(Process::CLOCK_REALTIME))
        messages.select { |m| m.expires_at > now }
      end

      EXPIRES_AT = 24
      CODEC_AT = 32
      LENGTHS_AT = 33

      # A message read from a record: holds the record string and reads each field out of it on first
      # access, so a backlog of 100 builds 100 small objects and nothing else until someone looks.
      class Message < Herald::Message
        include Herald::Message::LazyTargets

        NO_TARGETS = [nil, nil, nil].freeze
        JSON_ID = Codec::Json.id

        # standard:disable Lint/MissingSuper
        def initialize(record, channel = nil)
          @record = record
          @channel = channel
        end
        # standard:enable Lint/MissingSuper

        def global_id = @global_id ||= @record.unpack1("G").to_i

        def message_id = @message_id ||= @record.unpack1("G", offset: 8).to_i

        def created_at = @created_at ||= @record.unpack1("G", offset: 16)

        def expires_at = @record.unpack1("G", offset: EXPIRES_AT)

        def codec = @codec ||= Codec.fetch(@record.getbyte(CODEC_AT))

        def channel = @channel ||= @record.byteslice(HEADER_SIZE, lengths[0]).force_encoding(Encoding::UTF_8).freeze

        def site_id
          return @site_id if defined?(@site_id)
          @site_id = (lengths[1] == NO_SITE) ? nil : @record.byteslice(HEADER_SIZE + lengths[0], lengths[1]).force_encoding(Encoding::UTF_8).freeze
        end

        def payload
          @payload ||= begin
            offset = HEADER_SIZE + lengths[0] + site_length + lengths[2]
            bytes = @record.byteslice(offset, @record.bytesize - offset)
            bytes.force_encoding(Encoding::UTF_8) if @record.getbyte(CODEC_AT) == JSON_ID
            bytes.freeze
          end
        end

        private

        def lengths = @lengths ||= @record.unpack("NNN", offset: LENGTHS_AT)

        def site_length = (lengths[1] == NO_SITE) ? 0 : lengths[1]

        def unpacked_targets
          @targets ||= if lengths[2].zero?
            NO_TARGETS
          else
            MessagePack.unpack(@record.byteslice(HEADER_SIZE + lengths[0] + site_length, lengths[2])).freeze
          end
        end
      end
    end
  end
end
