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

      def self.tail(channel, payload, codec, created_at, max_age, site_id, user_ids, group_ids, client_ids)
        targets = (user_ids || group_ids || client_ids) ? MessagePack.pack([user_ids, group_ids, client_ids]) : EMPTY
        [created_at, created_at + max_age, codec.id, channel.bytesize, site_id ? site_id.bytesize : NO_SITE,
          targets.bytesize, channel, site_id || EMPTY, targets, payload].pack(TAIL_FORMAT)
      end

      # Decodes one record; nil when it has expired by `now`. `channel` avoids a copy when the caller knows it.
      def self.decode(record, now, channel = nil)
        gid, mid, created, expires, codec_id, chlen, sitelen, tlen = record.unpack(HEADER)
        return nil if expires <= now
        offset = HEADER_SIZE + chlen
        channel ||= record.byteslice(HEADER_SIZE, chlen).force_encoding(Encoding::UTF_8)
        site = nil
        if sitelen != NO_SITE
          site = record.byteslice(offset, sitelen).force_encoding(Encoding::UTF_8)
          offset += sitelen
        end
        users, groups, clients = MessagePack.unpack(record.byteslice(offset, tlen)) if tlen > 0
        offset += tlen
        codec = Codec.fetch(codec_id)
        payload = record.byteslice(offset, record.bytesize - offset)
        payload.force_encoding(Encoding::UTF_8) if codec == Codec::Json
        Message.new(global_id: gid.to_i, message_id: mid.to_i, channel: channel, payload: payload.freeze,
          codec: codec, created_at: created, user_ids: users, group_ids: groups, client_ids: clients, site_id: site)
      end

      def self.decode_all(records, channel = nil)
        now = Process.clock_gettime(Process::CLOCK_REALTIME)
        records.filter_map { |r| decode(r, now, channel) }
      end
    end
  end
end
