# frozen_string_literal: true

require "json"
require "msgpack"

module Herald
  module Rack
    # The bytes a message is sent as, built once per process per encoding and shared by every client
    # (docs/architecture.md, "A poll"): the JSON object, its streaming chunk (HTTP-framed and not), its SSE event and
    # its MessagePack map. Entries are kept in a two-generation cache keyed by global id, so a message read
    # again from the store (a new Message object) still reuses its bytes.
    #
    # Thread safety: the cache is read and filled from Puma threads and the event loop at once without a
    # lock. A race only builds the same frozen bytes twice; Hash operations themselves are atomic under the GVL.
    class Wire
      SEPARATOR = "\r\n|\r\n"
      ESCAPED_SEPARATOR = "\r\n||\r\n"
      CRLF = "\r\n"
      TERMINATOR = "0\r\n\r\n"
      STATUS_CHANNEL = "/__status"
      MSGPACK_EMPTY_ARRAY = "\x90".b.freeze

      # message_id, channel and payload tell whether an entry still belongs to the message with its global id: a store
      # that was reset (a wiped directory, a flushed Redis) hands out the same global ids again.
      Entry = Struct.new(:message_id, :channel, :payload, :json, :segment, :chunk, :sse, :msgpack, :msgpack_chunk, :poll_reply,
        :poll_replies)

      # Whole reply bodies kept for the next poll that gets the same messages (see #cached_reply): how many,
      # and the largest body kept.
      REPLY_CACHE_ENTRIES = 64
      REPLY_CACHE_BYTES = 64 * 1024
      # Distinct extra-header sets (extra_response_headers_lookup) whose hijacked poll reply a message keeps.
      HEADER_SETS = 8

      # The start of every response we write ourselves on a hijacked socket (message_bus's header order).
      HEAD = "HTTP/1.1 200 OK\r\ncache-control: must-revalidate, private, max-age=0\r\npragma: no-cache\r\nexpires: 0\r\n"

      # A JSON array as one streaming segment: escaped, then followed by the separator (docs/protocol.md 1.5).
      def self.segment(json_array)
        json_array = json_array.gsub(SEPARATOR, ESCAPED_SEPARATOR) if json_array.include?(SEPARATOR)
        (json_array + SEPARATOR).freeze
      end

      # HTTP/1.1 chunked framing of one piece of body, for sockets we write ourselves (full hijack).
      def self.frame(bytes) = "#{bytes.bytesize.to_s(16)}\r\n#{bytes}\r\n".b.freeze

      EMPTY_SEGMENT = segment("[]")
      EMPTY_CHUNK = frame(EMPTY_SEGMENT)

      # Each cached message holds its payload about five times over (JSON, segment, chunk, SSE event, whole
      # reply; or the MessagePack forms): the cache is bounded by that estimate as well as by count, so a run
      # of large messages cannot pin gigabytes (a fuzz soak grew the server by 70 MiB with kilobyte messages).
      COPIES = 5
      ENTRY_OVERHEAD = 512

      # capacity: messages per generation; max_bytes: estimated bytes for both generations together.
      def initialize(capacity: 10_000, max_bytes: 32 * 1024 * 1024)
        @capacity = capacity
        @generation_bytes = max_bytes / 2
        @young = {}
        @young_bytes = 0
        @old = {}
        @json_replies = {}
        @msgpack_replies = {}
      end

      # `{"global_id":..,"message_id":..,"channel":..,"data":..}`: JSON data is spliced in as stored.
      def json(msg)
        e = entry(msg)
        e.json || (e.json = build_json(msg))
      end

      # `[obj]\r\n|\r\n`: what a streaming body yields when the server does the HTTP chunking (Falcon).
      def segment(msg)
        e = entry(msg)
        e.segment || (e.segment = Wire.segment("[#{json(msg)}]".b))
      end

      # The segment framed as one HTTP chunk, for hijacked sockets.
      def chunk(msg)
        e = entry(msg)
        e.chunk || (e.chunk = Wire.frame(segment(msg)))
      end

      # One Server-Sent Event: `id:` is the global id, `data:` the same JSON object as the poll replies.
      def sse(msg)
        e = entry(msg)
        e.sse || (e.sse = "id: #{msg.global_id}\ndata: #{json(msg)}\n\n".b.freeze)
      end

      # A MessagePack map with the same four keys; MessagePack data is spliced in as stored.
      def msgpack(msg)
        e = entry(msg)
        e.msgpack || (e.msgpack = build_msgpack(msg))
      end

      # A whole hijacked long-poll reply carrying just this message: shared by every reader. `extra` is the
      # client's preformatted extra header lines ("" for none); the replies of a few distinct header sets
      # (a CORS origin or two) are kept too, so extra_response_headers_lookup keeps the fan-out encode-once.
      def poll_reply(msg, extra = "")
        e = entry(msg)
        return e.poll_reply || (e.poll_reply = build_poll_reply("[#{json(msg)}]", "")) if extra.empty?
        replies = (e.poll_replies ||= {})
        replies[extra] || begin
          bytes = build_poll_reply("[#{json(msg)}]", extra)
          (replies.size < HEADER_SETS) ? (replies[extra] = bytes) : bytes
        end
      end

      # The same for several messages (a fan-out of a batch): not kept, the fan-out shares it for its duration.
      def poll_reply_many(msgs, extra = "") = build_poll_reply(json_array(msgs), extra)

      # A one-element MessagePack array framed as one HTTP chunk (a client feeds a streaming unpacker).
      def msgpack_chunk(msg, framed: true)
        return "\x91".b + msgpack(msg) unless framed
        e = entry(msg)
        e.msgpack_chunk || (e.msgpack_chunk = Wire.frame("\x91".b + msgpack(msg)))
      end

      # The per-client `/__status` message (docs/protocol.md 1.7); never cached, it differs per client.
      def status_json(status)
        %({"global_id":-1,"message_id":-1,"channel":"/__status","data":#{JSON.generate(status)}}).b
      end

      def status_msgpack(status)
        MessagePack.pack("global_id" => -1, "message_id" => -1, "channel" => STATUS_CHANNEL, "data" => status)
      end

      # A whole reply body: a JSON array or a MessagePack array of messages, then the status if any.
      def json_array(msgs, status = nil)
        return build_json_array(msgs, status) if status || msgs.empty?
        cached_reply(@json_replies, msgs) { build_json_array(msgs, nil) }
      end

      def msgpack_array(msgs, status = nil)
        return build_msgpack_array(msgs, status) if status || msgs.empty?
        cached_reply(@msgpack_replies, msgs) { build_msgpack_array(msgs, nil) }
      end

      private

      # Polls that ask for the same positions get the same messages, and the stores hand out the same
      # Message objects for them until something changes (the Log's index, the backlog caches): a reply
      # built once is reused while every message in it is the very object it was built from (checked by
      # identity, so a reset store's new message with an old global id is never answered with old bytes).
      def cached_reply(cache, msgs)
        key = msgs.first.global_id * 4096 + msgs.size # collisions only cost a rebuild: the check below decides
        hit = cache[key]
        return hit[1] if hit && same_objects?(hit[0], msgs)
        bytes = yield.freeze
        return bytes if bytes.bytesize > REPLY_CACHE_BYTES
        cache.clear if cache.size >= REPLY_CACHE_ENTRIES
        cache[key] = [msgs.dup.freeze, bytes].freeze
        bytes
      end

      def same_objects?(cached, msgs)
        return false unless cached.size == msgs.size
        i = 0
        while i < msgs.size
          return false unless cached[i].equal?(msgs[i])
          i += 1
        end
        true
      end

      def build_poll_reply(body, extra)
        "#{HEAD}#{extra}connection: close\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: #{body.bytesize}\r\n\r\n#{body}".b.freeze
      end

      def build_json_array(msgs, status)
        out = +"["
        msgs.each_with_index do |m, i|
          out << "," if i > 0
          out << json(m)
        end
        if status
          out << "," unless msgs.empty?
          out << status_json(status)
        end
        out << "]"
      end

      def build_msgpack_array(msgs, status)
        count = msgs.size + (status ? 1 : 0)
        out = MessagePack::Packer.new.write_array_header(count).to_s
        msgs.each { |m| out << msgpack(m) }
        out << status_msgpack(status) if status
        out
      end

      def entry(msg)
        key = msg.global_id
        e = @young[key]
        return e if e && same?(e, msg)
        e = @old.delete(key)
        store(key, (e && same?(e, msg)) ? e : Entry.new(msg.message_id, msg.channel, msg.payload))
      end

      def same?(e, msg)
        e.message_id == msg.message_id && e.channel == msg.channel && (e.payload.equal?(msg.payload) || e.payload == msg.payload)
      end

      def store(key, e)
        @young[key] = e
        @young_bytes += e.payload.bytesize * COPIES + ENTRY_OVERHEAD
        if @young.size > @capacity || @young_bytes > @generation_bytes
          @old = @young
          @young = {}
          @young_bytes = 0
        end
        e
      end

      def build_json(msg)
        data = msg.codec.equal?(Codec::Json) ? msg.payload : transcoded_json(msg)
        head = %({"global_id":#{msg.global_id},"message_id":#{msg.message_id},"channel":)
        (head.b << JSON.generate(msg.channel).b << ',"data":' << data.b << "}").freeze
      end

      # A MessagePack message for a JSON client. Binary Strings have no JSON form: such a message goes out
      # with data null (and a warning) rather than failing the whole reply.
      def transcoded_json(msg)
        JSON.generate(msg.data)
      rescue JSON::JSONError, EncodingError => e
        Herald.logger.warn "#{msg.channel} ##{msg.global_id} has no JSON form (#{e.message}): sent with data null; " \
          "clients that need binary should ask for application/vnd.msgpack"
        "null"
      end

      def build_msgpack(msg)
        packer = MessagePack::Packer.new
        packer.write_map_header(4).write("global_id").write(msg.global_id).write("message_id")
          .write(msg.message_id).write("channel").write(msg.channel).write("data")
        data = msg.codec.equal?(Codec::Msgpack) ? msg.payload : MessagePack.pack(msg.data)
        (packer.to_s.b << data.b).freeze
      end
    end
  end
end
