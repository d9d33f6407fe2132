# frozen_string_literal: true

module Herald
  class Server
    # Whole replies to repeated polls, for herald server's front end. Many clients ask the same thing (the
    # same channels at the same positions, `?dlp=t` or with a backlog to send); while the store holds the
    # same messages the answer is the same bytes, so the front end writes them without running the
    # middleware. Only replies the middleware marked as shared are kept (Rack::Responder::SHARED_REPLY: no
    # lookups, filters or instrumentation, no targeted message), keyed by everything of the request the
    # middleware reads except the client id (checked as it would be). An entry is good while the store's
    # last global id is the one read before the reply was built (any publish, from any process the store
    # has caught up with, ends it) and for at most MAX_AGE seconds (messages that age out of a backlog).
    class ReplyCache
      MAX_AGE = 1.0
      MAX_ENTRIES = 256 # distinct requests; all are dropped when full (they are rebuilt on the next poll)
      CLIENT_ID = Rack::Responder::CLIENT_ID

      Entry = Struct.new(:bytes, :stamp, :expires)

      def initialize(store:, prefix:)
        @store = store
        @prefix = prefix
        @entries = {}
      end

      # The key for a request to the middleware (a POST poll), or nil when it is not one to share.
      def key(env, body)
        return nil unless env["REQUEST_METHOD"] == "POST" && env["SERVER_PROTOCOL"] == "HTTP/1.1"
        path = env["REQUEST_PATH"] or return nil
        from = @prefix.bytesize
        slash = path.index("/", from)
        id = slash ? path.byteslice(from, slash - from) : path.byteslice(from, path.bytesize - from)
        return nil unless CLIENT_ID.match?(id)
        [slash ? path.byteslice(slash, path.bytesize - slash) : "", env["QUERY_STRING"], env["CONTENT_TYPE"],
          env["HTTP_ACCEPT"], env["HTTP_DONT_CHUNK"], env["HTTP_VERSION"], body]
      end

      # The store's state now: read before the middleware builds a reply, given back to #store.
      def stamp = @store.last_global_id

      def fetch(key)
        entry = @entries[key] or return nil
        return entry.bytes if entry.stamp == @store.last_global_id && now < entry.expires
        @entries.delete(key)
        nil
      end

      def store(key, bytes, stamp)
        @entries.clear if @entries.size >= MAX_ENTRIES
        @entries[key] = Entry.new(bytes.dup.freeze, stamp, now + MAX_AGE)
      end

      def size = @entries.size

      private

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
