# frozen_string_literal: true

module Herald
  module Rack
    # Serves `{base_route}message-bus/...`, speaking the message_bus protocol (docs/protocol.md; the
    # checklist is its section 1.12) so message_bus's own JS and Ruby clients work as is:
    #
    #   POST|OPTIONS {base}message-bus/{client_id}[/poll]   long poll, chunked stream or immediate reply
    #   GET          {base}message-bus/{client_id}/sse?/chat=5&/news=
    #                Server-Sent Events (text/event-stream); each event's `id:` is the global id, and a
    #                reconnecting EventSource's Last-Event-ID resumes after it on every listed channel.
    #   GET          {base}message-bus/herald.js   Herald's browser client (js/; see ClientScript)
    #
    # `Accept: application/vnd.msgpack` gets MessagePack instead of JSON: a reply is one array of maps with the
    # same keys; a stream is a sequence of such arrays (feed it to a streaming unpacker).
    #
    # The client id is a bearer token: anyone who knows it gets the messages published with `client_ids:`
    # naming it. Use user_ids/group_ids with the lookups for real access control.
    #
    #   use Herald::Rack::Middleware, bus: Herald.bus, user_id_lookup: ->(env) { env["warden"].user&.id }
    class Middleware
      JSON_TYPE = "application/json; charset=utf-8"
      CHUNKED_TYPE = "text/plain; charset=utf-8"
      SSE_TYPE = "text/event-stream"
      MSGPACK_TYPE = "application/vnd.msgpack"
      # The headers of every reply, per content type, in message_bus's order (docs/protocol.md 1.4); copied for
      # each response (Rack 3: an unfrozen Hash, and middleware in front may add to it).
      REPLY_HEADERS = [JSON_TYPE, CHUNKED_TYPE, SSE_TYPE, MSGPACK_TYPE].to_h do |type|
        [type, {"cache-control" => "must-revalidate, private, max-age=0", "content-type" => type, "pragma" => "no-cache", "expires" => "0"}.freeze]
      end.freeze
      DEFAULTS = {
        base_route: "/",
        long_polling_interval: 25, # seconds a poll or stream is held (message_bus: 25 000 ms)
        long_polling_enabled: true,
        chunked_encoding_enabled: true,
        max_active_clients: 1000, # parked clients per process; over it: the backlog at once, or 429
        retry_after: 15, # seconds, for the 429 (the JS client waits max(15, Retry-After))
        max_body_bytes: 64 * 1024, # 413 over it
        max_channels: 100, # per poll; 400 over it
        write_timeout: 10, # seconds a parked client may refuse bytes before it is dropped
        max_buffer: 4 * 1024 * 1024, # bytes queued for one slow client before it is dropped (mostly shared, not copied)
        # is_admin_lookup is accepted for message_bus compatibility (it gates message_bus's diagnostics page,
        # which Herald does not have) and unused.
        user_id_lookup: nil, group_ids_lookup: nil, site_id_lookup: nil, is_admin_lookup: nil,
        extra_response_headers_lookup: nil, client_message_filters: [], on_error: nil,
        # ->(env, error) { [status, headers, body] or nil }, as message_bus's on_middleware_error: maps an
        # exception raised while answering (a lookup that fails, a broken pipe) to a response. Without it,
        # or when it returns nil, the error is logged and raised on to the app server.
        on_middleware_error: nil,
        # A repeated poll (the same channels and positions, client id aside) is answered with the reply body
        # built for the first while the store is unchanged, for at most a second (ReplyCache). Only when no
        # user/group/site lookup or filter makes replies differ between clients. false: every poll is built.
        reply_cache: true
      }.freeze
      PER_CLIENT = Transport::PER_CLIENT
      POST = "POST"
      # A client id (Responder::CLIENT_ID) at a position of the path, then a slash or the end.
      CLIENT_ID_AT = %r{\G[A-Za-z0-9_.~-]{1,128}(?=/|\z)}
      # Paths whose poll_path? answer is kept, and how long such a path may be (a 32-character id's path is 50 bytes).
      MAX_PATHS = 8192
      MAX_PATH_BYTES = 200

      # The path prefix this middleware answers ("/message-bus/" by default): herald server answers these
      # requests on its event loop.
      attr_reader :options, :prefix

      def initialize(app, bus: nil, **options)
        unknown = options.keys - DEFAULTS.keys
        raise InvalidArgumentError, "Unknown option #{unknown.first.inspect}, expected one of #{DEFAULTS.keys.inspect}" if unknown.any?
        @app = app
        @options = DEFAULTS.merge(options).freeze
        @prefix = "#{normalize_base(@options[:base_route])}message-bus/"
        @transport = Transport.new(bus: bus, options: @options, prefix: @prefix) # nil bus: Herald's default, per request
        @cache_polls = @transport.cache_polls?
        @plain_headers = !@options[:extra_response_headers_lookup] # the same headers for every JSON reply
        @poll_paths = {}
        @fixed_cache = nil
      end

      def call(env)
        path = env["PATH_INFO"].to_s
        path.start_with?(@prefix) ? serve(env, path) : @app.call(env)
      end

      # The process's transport state (bus, event loop, reply cache): see Transport.
      attr_reader :transport

      def bus = @transport.bus

      def reactor = @transport.reactor

      def reply_cache = @transport.reply_cache

      def shareable? = @transport.shareable?

      def active_clients = @transport.active_clients

      # Ends every parked client (each gets its final `[]`), then stops the event loop.
      def close = @transport.close

      def wire = @transport.wire

      def filters = @transport.filters

      def on_error = @transport.on_error

      private

      # The app's own errors (#call) stay the app's: only ours go to on_middleware_error, as in message_bus.
      def serve(env, path)
        miss = nil
        if @cache_polls
          found = cached(env, path)
          return found if found.is_a?(Array)
          miss = found
        end
        client_id, action = path.byteslice(@prefix.bytesize, path.bytesize).split("/", 3)
        return [404, {}, ["not found"]] if client_id.nil? || client_id.empty?
        return ClientScript.call(env) if ClientScript.request?(env, client_id, action)
        skip_session(env)
        Responder.new(@transport, env, client_id, action, miss: miss).call
      rescue RequestError => e
        [e.status, {"content-type" => "text/plain; charset=utf-8", "content-length" => (e.message.bytesize + 1).to_s}, ["#{e.message}\n"]]
      rescue => e
        middleware_error(env, e)
      end

      # A POST poll asked before while the store is unchanged (clients with nothing new, many clients at the
      # same positions): the ReplyCache's body with this request's headers, before the path is split or a
      # Responder built (that work was most of what a poll cost beyond Puma's own). Otherwise nil
      # or a ReplyCache::Miss with the body read, under which the Responder keeps a shareable reply (when it
      # has a cache: none for a request not to share). Every wrk request of bench/http_poll_bench.rb comes
      # here: bench/middleware_cpu_bench.rb counts its instructions.
      def cached(env, path)
        return nil unless env["REQUEST_METHOD"] == POST && poll_path?(path)
        return nil if Instrumentation.listening?(Responder::POLL) # every such poll gets its event
        type = env["CONTENT_TYPE"]
        body = PollRequest.body(env, @options[:max_body_bytes], type) or return nil
        found = (@fixed_cache || current_reply_cache).find(env, body, type)
        # The body is read: the Responder gets it (rack.input need not rewind: Rack 3).
        return found || ReplyCache::Miss.new(nil, body) unless found.is_a?(Array) # an entry (ReplyCache::Entry)
        skip_session(env) if env.key?("rack.session.options")
        # Read by Entry's named indexes, not its readers: two method calls cost ~500 instructions per cached poll.
        reply = found[ReplyCache::Entry::VALUE]
        accept = found[ReplyCache::Entry::ACCEPT] # this request's
        messages = found[ReplyCache::Entry::MESSAGES]
        Metrics::DELIVERED.add(messages, Metrics::LONG_POLL) if messages > 0
        return Responder.cached(@transport, env, reply, messages) unless @plain_headers && !accept&.include?(MSGPACK_TYPE)
        env[EnvKeys::SHARED_REPLY] = messages
        [200, json_headers, [reply]]
      end

      # A given bus keeps its store, so its reply cache is kept here: one ivar read on the cached poll's path
      # (asking the transport costs two calls, ~900 instructions a poll); the default bus may change.
      def current_reply_cache
        cache = @transport.reply_cache
        @fixed_cache = cache if @transport.given_bus?
        cache
      end

      # REPLY_HEADERS[JSON_TYPE], as a literal: Ruby copies a literal Hash of Strings in one instruction
      # (200 instructions; Hash#dup costs 1,300). A test keeps the two equal.
      def json_headers
        {"cache-control" => "must-revalidate, private, max-age=0", "content-type" => "application/json; charset=utf-8",
         "pragma" => "no-cache", "expires" => "0"}
      end

      # True for a path whose reply may come from the ReplyCache: a valid client id after the prefix, then a
      # slash or the end, and no SSE (never cached; any "/sse" after the prefix, as ReplyCache#lookup). The
      # answer is kept per path, as clients poll again and again with theirs: the regex costs 5,000
      # instructions on a 32-character id, more than a sixth of a cached reply. At most MAX_PATHS short paths
      # are kept (then all are dropped); a lost race only checks a path twice (Hash ops are atomic under the GVL).
      def poll_path?(path)
        known = @poll_paths[path]
        return known unless known.nil?
        ok = path.match?(CLIENT_ID_AT, @prefix.bytesize) && !path.index(ReplyCache::SSE, @prefix.bytesize)
        return ok if path.bytesize > MAX_PATH_BYTES
        @poll_paths = {} if @poll_paths.size >= MAX_PATHS
        @poll_paths[path] = ok # an unfrozen String key is copied and frozen by Hash#[]=
        ok
      end

      # As message_bus's base_route=: a leading and a trailing slash, repeated slashes squeezed
      # ("//my///base/route" serves /my/base/route/message-bus/).
      def normalize_base(base) = base.to_s.gsub(%r{\A(?!/)|(?<!/)\z|//+}, "/")

      def middleware_error(env, error)
        hook = @options[:on_middleware_error]
        response = hook&.call(env, error)
        return response if response
        raise error
      rescue => raised
        # Unhandled (no hook, the hook returned nil, or it raised): the app server may log nothing (herald
        # server runs Puma without a log), so say it here before it goes on.
        Herald.logger.error "http transport: #{env["REQUEST_METHOD"]} #{env["PATH_INFO"]} failed: #{raised.class}: #{raised.message} (#{raised.backtrace&.first})"
        raise
      end

      # Polls never rewrite the session cookie (message_bus issue #257). A session middleware in front of us
      # has put its options in the env already; without one there is nothing to skip.
      def skip_session(env)
        options = env["rack.session.options"] or return
        options[:skip] = true if options.respond_to?(:[]=)
      end
    end
  end
end
