# frozen_string_literal: true

module Herald
  module Rack
    # Whole replies to repeated polls. Many clients ask the same thing (the same channels at the same
    # positions, `?dlp=t` or with a backlog to send); while the store holds the same messages the answer is
    # the same bytes, so it is given again without reading the store or running the Responder. Used by the
    # middleware (the reply body, headers rebuilt per request) and by herald server's front end (the whole
    # HTTP reply, before the middleware runs): one set of rules for both.
    #
    # Only replies the Responder marked as shareable are kept (no user/group/site lookups, filters or
    # instrumentation, no targeted message sent or withheld), keyed by everything of the request the
    # middleware reads except the client id (checked as it would be). An entry is good while the store's
    # last global id is the one read before the reply was built (any publish, from any process the store
    # has caught up with, ends it), its epoch unchanged, and for at most MAX_AGE seconds (messages that age
    # out of a backlog).
    #
    # Thread safety: Puma threads read and fill it at once without a lock. Entries are immutable; a race
    # only drops or rebuilds an entry (Hash operations are atomic under the GVL).
    class ReplyCache
      MAX_AGE = 1.0
      MAX_ENTRIES = 256 # distinct requests; all are dropped when full (they are rebuilt on the next poll)
      MAX_BYTES = 8 * 1024 * 1024 # replies stored since the last clear; all are dropped when a new one would pass it
      MAX_REPLY_BYTES = MAX_BYTES / 8 # a larger reply is not kept
      MAX_BODY_BYTES = 8 * 1024 # a request with a larger body (hundreds of channels) gets no key
      POST = "POST"
      HTTP11 = "HTTP/1.1"
      SSE = "/sse"

      # Entries are found by the request body (a String: one hash of a short string), then by the other
      # fields the Responder reads. An Array of several fields as the key costs twice the whole lookup
      # (Array#hash and #eql? guard against recursion). Lists are replaced, never changed (readers hold no lock).
      # An entry is a frozen Array: [query, type, accept, dont_chunk, value, stamp, epoch, expires, messages]. Reading an
      # Array by a literal index is one VM instruction; a Struct member is a method call, whose call cache and
      # method entry are cache misses of their own when the lookup runs cold (between Puma's requests).
      ENTRY_FIELDS = %i[query type accept dont_chunk value stamp epoch expires messages].freeze
      # How code outside this class reads an entry: by name, never by a number. Module functions on the frozen
      # Array (an entry stays one object, a reader allocates nothing), or the named indexes where a method call
      # counts (Middleware#cached, every cached poll: bench/counts.rb poll10 measured ~24,000 instructions/op with
      # either literals or these constants, ~500 more through the two readers).
      module Entry
        ACCEPT = ENTRY_FIELDS.index(:accept)
        VALUE = ENTRY_FIELDS.index(:value)
        MESSAGES = ENTRY_FIELDS.index(:messages) # how many messages the reply carries (Herald::Metrics)

        # The kept reply body (a frozen String).
        def self.reply(entry) = entry[VALUE]

        # The Accept header of the request it was kept for: the same as this request's (part of the key).
        def self.accept(entry) = entry[ACCEPT]
      end
      # A request to share that found no entry: #store keeps its reply (built by the Responder) under it.
      # The middleware also hands a request's body to the Responder in one (cache nil: nothing to keep).
      Miss = Struct.new(:cache, :body, :query, :type, :accept, :dont_chunk)

      def initialize(store:, prefix:)
        @store = store
        @prefix = prefix
        @entries = {} # body => frozen Array of entries
        @count = 0
        @bytes = 0
      end

      # For a request to the middleware: the reply kept for it (a String), a Miss, or nil when it is not one
      # to share. path: the request's path (its client id already checked); body: the request body as the
      # middleware parses it, nil when the channels do not come from it (PollRequest.body: forced channels).
      # What the key leaves out is what the Responder does not read for a shareable reply: the client id, the
      # action after it (every one but `sse`, never shared, answers the same), HTTP_VERSION (read only when
      # SERVER_PROTOCOL is not HTTP/1.1).
      def lookup(env, path, body)
        return nil unless body && env["REQUEST_METHOD"] == POST && !path.index(SSE, @prefix.bytesize)
        found = find(env, body)
        return found unless found.is_a?(Array)
        # herald server's every cached poll: no method call beyond the count of what it delivers
        Metrics::DELIVERED.add(found[Entry::MESSAGES], Metrics::LONG_POLL) if found[Entry::MESSAGES] > 0
        found[Entry::VALUE]
      end

      # #lookup for a POST whose path the middleware checked itself (Middleware#poll_path?), returning the
      # entry found (an Array, see ENTRY_FIELDS; read it through Entry) instead of its value.
      # Asked on every such poll, so written out: no method call per field, the clock read last. type:
      # env["CONTENT_TYPE"], when the caller has read it (every env lookup hashes its key).
      def find(env, body, type = env["CONTENT_TYPE"])
        return nil unless body.bytesize <= MAX_BODY_BYTES && env["SERVER_PROTOCOL"] == HTTP11
        query = env["QUERY_STRING"]
        accept = env["HTTP_ACCEPT"]
        dont_chunk = env["HTTP_DONT_CHUNK"]
        if (list = @entries[body])
          i = 0
          while (e = list[i])
            if e[0] == query && e[1] == type && e[2] == accept && e[3] == dont_chunk
              # (a reset store, a wiped log or a flushed Redis, has a new epoch)
              fresh = e[5] == @store.peek_last_global_id && e[6] == @store.known_epoch && Process.clock_gettime(Process::CLOCK_MONOTONIC) < e[7]
              return e if fresh
              break
            end
            i += 1
          end
        end
        Miss.new(self, body, query, type, accept, dont_chunk)
      end

      # The same for a request the middleware has not seen yet (herald server's front end): the client id in
      # the path is checked as the middleware checks it (nil when it would be refused).
      def lookup_path(env, path, body)
        from = @prefix.bytesize
        slash = path.index("/", from)
        id = slash ? path.byteslice(from, slash - from) : path.byteslice(from, path.bytesize - from)
        return nil unless Responder::CLIENT_ID.match?(id)
        lookup(env, path, body)
      end

      # The store's state now: read before the reply is built, given back to #store.
      def stamp = @store.last_global_id

      # value: a frozen String (it is handed to every later request like miss's); messages: how many it carries.
      def store(miss, value, stamp, messages = 0)
        size = value.bytesize
        return if size > MAX_REPLY_BYTES
        if @count >= MAX_ENTRIES || @bytes + size > MAX_BYTES
          @entries = {}
          @count = 0
          @bytes = 0
        end
        @count += 1 # entries and bytes stored since the last clear: at least what is held (racy by a store or two)
        @bytes += size
        entry = [miss.query, miss.type, miss.accept, miss.dont_chunk, value, stamp, epoch, now + MAX_AGE, messages].freeze
        others = @entries[miss.body]&.reject do |e|
          e[0] == miss.query && e[1] == miss.type && e[2] == miss.accept && e[3] == miss.dont_chunk
        end
        @entries[miss.body] = [*others, entry].freeze
      end

      def size = @entries.each_value.sum(&:size)

      # True when this is the cache of that store (a middleware starts a new one for a new bus).
      def for?(store) = @store.equal?(store)

      private

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      def epoch = @store.known_epoch
    end
  end
end
