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

      Entry = Struct.new(:value, :stamp, :epoch, :expires)

      def initialize(store:, prefix:)
        @store = store
        @prefix = prefix
        @entries = {}
        @bytes = 0
        @epochs = store.respond_to?(:known_epoch) # a reset store (a wiped log, a flushed Redis) has a new epoch
      end

      # The key for a request to the middleware (a POST poll), or nil when it is not one to share. action:
      # what follows the client id in the path ("poll", nil), the client id already checked; body: the request
      # body as the middleware parses it.
      def key(env, action, body)
        return nil unless body && body.bytesize <= MAX_BODY_BYTES && env["REQUEST_METHOD"] == POST && env["SERVER_PROTOCOL"] == HTTP11
        return nil if env.key?("message_bus.channels") # forced by an upstream middleware: not in the key
        [action, env["QUERY_STRING"], env["CONTENT_TYPE"], env["HTTP_ACCEPT"], env["HTTP_DONT_CHUNK"], env["HTTP_VERSION"], body]
      end

      # The same for a request not yet parsed by the middleware (herald server's front end): path is the whole
      # path; the client id in it is checked as the middleware checks it (nil when it would be refused).
      def key_for_path(env, path, body)
        from = @prefix.bytesize
        slash = path.index("/", from)
        id = slash ? path.byteslice(from, slash - from) : path.byteslice(from, path.bytesize - from)
        return nil unless Responder::CLIENT_ID.match?(id)
        key(env, slash && path.byteslice(slash + 1, path.bytesize).split("/", 2).first, body)
      end

      # The store's state now: read before the reply is built, given back to #store.
      def stamp = @store.last_global_id

      def fetch(key)
        entry = @entries[key] or return nil
        return entry.value if entry.stamp == @store.last_global_id && entry.epoch == epoch && now < entry.expires
        @entries.delete(key)
        nil
      end

      # value: a frozen String (it is handed to every later request with the same key).
      def store(key, value, stamp)
        size = value.bytesize
        return if size > MAX_REPLY_BYTES
        if @entries.size >= MAX_ENTRIES || @bytes + size > MAX_BYTES
          @entries.clear
          @bytes = 0
        end
        @bytes += size # bytes stored since the last clear: at least what is held (racy by a store or two)
        @entries[key] = Entry.new(value, stamp, epoch, now + MAX_AGE)
      end

      def size = @entries.size

      # True when this is the cache of that store (a middleware starts a new one for a new bus).
      def for?(store) = @store.equal?(store)

      private

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      def epoch = @epochs ? @store.known_epoch : nil
    end
  end
end
