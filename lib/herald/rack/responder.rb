# frozen_string_literal: true

module Herald
  module Rack
    # Answers one request under `message-bus/`: parses it, reads the backlog with message_bus's five
    # last-id cases (docs/protocol.md 1.2), then replies now or parks the client on the event loop
    # (the decision tree of docs/protocol.md 1.3).
    class Responder
      CLIENT_ID = /\A[A-Za-z0-9_.~-]{1,128}\z/
      HEADER_SAFE = /\A[^\r\n\0]*\z/
      EMPTY = {}.freeze
      EPOCH_HEADER = "herald-epoch"
      EPOCH_SAFE = /\A[\x21-\x7e]{1,100}\z/
      POLL = "poll.herald"

      # miss: the ReplyCache::Miss of this request (Middleware#cached): its body is the request's, and a
      # shareable reply is kept under its key.
      # transport: the process's Rack::Transport (bus, reactor, wire, filters, options).
      def initialize(transport, env, client_id, action, miss: nil)
        @transport = transport
        @miss = miss
        @options = transport.options
        @env = env
        @client_id = client_id
        @action = action
        @payload = nil # poll.herald's, when somebody listens
      end

      # The reply to a request whose body Middleware#cached found in the ReplyCache: this request's headers.
      def self.cached(transport, env, body, messages) = new(transport, env, nil, nil).cached(body, messages)

      def cached(body, messages)
        @env[EnvKeys::SHARED_REPLY] = messages unless @options[:extra_response_headers_lookup]
        reply_of(body)
      end

      def call
        return [200, headers(Middleware::JSON_TYPE), ["OK"]] if @env["REQUEST_METHOD"] == "OPTIONS" && client_id?
        Instrumentation.listening?(POLL) ? instrumented : answer
      end

      private

      def client_id? = @client_id.match?(CLIENT_ID)

      def answer
        raise RequestError, "client id must be 1-128 characters of A-Z a-z 0-9 _ . ~ -" unless client_id?
        sse = @action == "sse"
        request = if sse
          PollRequest.from_query(@env["QUERY_STRING"].to_s, max_channels: @options[:max_channels])
        else
          PollRequest.from_env(@env, max_body_bytes: @options[:max_body_bytes], max_channels: @options[:max_channels], body: @miss&.body)
        end
        @payload[:channels] = request.channels.size if @payload
        client = build_client(request)
        store = @transport.bus.store
        @epoch = store.known_epoch # before the snapshot: a reset after it is seen by the reactor (Reactor#admit)
        snapshot = @stamp = store.last_global_id # before anything is read: a publish after it ends a cached reply
        msgs, status = sse ? sse_backlog(client, request) : backlog(client, request)
        respond(client, msgs, status, snapshot, sse)
      end

      # poll.herald: what was asked and answered, never who asked (the client id is a bearer token). A
      # RequestError is reported by its status (400, 413), not as an exception: its message is the client's.
      def instrumented
        @payload = {channels: 0, mode: nil, status: nil, messages: 0, parked: false}
        error = nil
        response = Instrumentation.instrument(POLL, @payload) do
          answer.tap { |r| @payload[:status] = r[0] }
        rescue RequestError => e
          @payload[:status] = e.status
          error = e
        end
        error ? raise(error) : response
      end

      # The transport the client asked for: SSE, a chunked stream, a long poll or a short (dlp=t) poll.
      def mode(sse)
        return :sse if sse
        return :short_poll unless long_polling?
        chunked? ? :chunked : :long_poll
      end

      def respond(client, msgs, status, snapshot, sse)
        @payload[:mode] = mode(sse) if @payload
        ready = !msgs.empty? || status
        return park(client, :sse, msgs, status, snapshot) if sse && room?
        return too_many if sse
        return shared(reply(msgs, status), msgs) if ready && !chunked?
        return shared(reply(msgs, status), msgs) unless long_polling?
        return (ready ? reply(msgs, status) : too_many) unless room?
        park(client, chunked? ? :chunked : :poll, msgs, status, snapshot)
      end

      def build_client(request)
        site_id = lookup(:site_id_lookup)
        group_ids = lookup(:group_ids_lookup)
        Client.new(id: @client_id, user_id: lookup(:user_id_lookup), group_ids: group_ids && Array(group_ids),
          site_id: site_id, seq: request.seq, positions: {})
      end

      def lookup(name)
        fn = @options[name] or return nil
        fn.call(@env)
      end

      # The table of docs/protocol.md 1.2, per channel. Sets the client's positions; returns [messages, status].
      def backlog(client, request)
        bus = @transport.bus
        last_ids = bus.last_ids(*request.channels.keys, site_id: client.site_id)
        msgs = []
        status = nil
        request.channels.each do |channel, asked|
          last = last_ids[channel] || 0
          client.positions[channel] = last
          next if asked.nil? || asked == last
          if asked == -1 || asked > last
            (status ||= {})[channel] = last
            next
          end
          from = (asked < -1) ? [last + asked + 1, 0].max : asked
          found = bus.backlog(channel, from, site_id: client.site_id)
          status = take(client, channel, found, msgs, status)
        end
        [msgs, status]
      end

      # Adds the messages the client may see; a withheld one puts the channel's position in the status,
      # so the client jumps past what it will never receive (docs/protocol.md 1.7 c).
      def take(client, channel, found, msgs, status)
        withheld = false
        position = client.positions[channel]
        found.each do |msg|
          position = msg.message_id if msg.message_id > position
          client.allowed?(msg, @transport.filters) ? msgs << msg : withheld = true
        end
        client.positions[channel] = position
        if withheld
          (status ||= {})[channel] = position
          @withheld = true # this client's reply differs from another's (see #shared)
        end
        status
      end

      # SSE: the query gives channel => last id as a poll does; a reconnecting EventSource's Last-Event-ID
      # (a global id) replaces them: every message after it on the listed channels, in global order.
      def sse_backlog(client, request)
        header = @env["HTTP_LAST_EVENT_ID"]
        return backlog(client, request) if header.nil? || header.empty?
        after = PollRequest.integer(header, "Last-Event-ID")
        raise RequestError, "Last-Event-ID must be a global id >= 0" if after.nil? || after < 0
        msgs = []
        status = nil
        last_ids = @transport.bus.last_ids(*request.channels.keys, site_id: client.site_id)
        request.channels.each_key do |channel|
          client.positions[channel] = last_ids[channel] || 0
          found = @transport.bus.backlog(channel, 0, site_id: client.site_id).select { |m| m.global_id > after }
          status = take(client, channel, found, msgs, status)
        end
        [msgs.sort_by!(&:global_id), status]
      end

      def reply(msgs, status)
        @payload[:messages] = msgs.size if @payload
        Metrics::DELIVERED.add(msgs.size, Metrics::LONG_POLL) unless msgs.empty?
        reply_of(msgpack? ? @transport.wire.msgpack_array(msgs, status) : @transport.wire.json_array(msgs, status))
      end

      # A fresh headers Hash and body Array each time: middleware in front of us may add to them.
      def reply_of(body) = [200, headers(msgpack? ? Middleware::MSGPACK_TYPE : Middleware::JSON_TYPE), [body]]

      def cacheable? = @payload.nil? && @transport.shareable?

      # The reply depends only on the request and the store, not on who asked: not for an instrumented
      # request, lookups or filters (they see the env), a targeted message sent or withheld (client_ids:
      # the reply depends on the client id) or forced channels. Kept in the middleware's ReplyCache (the
      # body; headers are built per request) and marked for herald server's front end (see EnvKeys::SHARED_REPLY).
      def shared(response, msgs)
        return response if !cacheable? || @withheld || @env.key?("message_bus.channels") || !msgs.all?(&:public?)
        @miss&.cache&.store(@miss, response[2][0].freeze, @stamp, msgs.size)
        @env[EnvKeys::SHARED_REPLY] = msgs.size unless @options[:extra_response_headers_lookup]
        response
      end

      def too_many
        [429, headers(Middleware::CHUNKED_TYPE).merge("retry-after" => @options[:retry_after].to_s), ["too many clients, retry later\n"]]
      end

      def park(client, mode, msgs, status, snapshot)
        if @payload
          @payload[:parked] = true
          @payload[:messages] = msgs.size # a stream's backlog, written as it starts
        end
        reactor = @transport.reactor
        common = {client: client, mode: mode, encoding: msgpack? ? :msgpack : :json, wire: @transport.wire}
        if hijack?
          io = @env["rack.hijack"].call
          io = @env["rack.hijack_io"] unless io.respond_to?(:write_nonblock)
          conn = SocketConnection.new(io: io, extra_headers: extra_header_lines, max_buffer: @options[:max_buffer], **common)
          conn.deadline = deadline
          reactor.park(conn, msgs, status, snapshot, @epoch)
          return [200, {}, []] # the server ignores the response after a full hijack
        end
        conn = QueueConnection.new(max_queue: 1000, on_gone: reactor.method(:gone), **common)
        conn.deadline = deadline
        reactor.park(conn, msgs, status, snapshot, @epoch)
        [200, stream_headers(mode), conn.rack_body(streaming: !Fiber.scheduler.nil?)]
      end

      def deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @options[:long_polling_interval]

      # Full hijack on a threaded server (Puma). Under a fiber scheduler (Falcon) a streaming body is as
      # cheap and lets the server keep the connection.
      def hijack? = @env["rack.hijack?"] && @env["rack.hijack"] && Fiber.scheduler.nil?

      def stream_headers(mode)
        return headers(Middleware::MSGPACK_TYPE) if msgpack?
        case mode
        when :poll then headers(Middleware::JSON_TYPE)
        when :chunked then headers(Middleware::CHUNKED_TYPE).merge("x-content-type-options" => "nosniff")
        else headers(Middleware::SSE_TYPE).merge("x-accel-buffering" => "no")
        end
      end

      def room? = @transport.active_clients < @options[:max_active_clients]

      def long_polling? = @options[:long_polling_enabled] && !@env["QUERY_STRING"].to_s.include?("dlp=t")

      def chunked?
        http11 = @env["SERVER_PROTOCOL"] == "HTTP/1.1" || @env["HTTP_VERSION"] == "HTTP/1.1"
        http11 && !@env["HTTP_DONT_CHUNK"] && @options[:chunked_encoding_enabled]
      end

      # SSE is text (text/event-stream, JSON in its data lines) whatever the Accept header asks for.
      def msgpack? = @action != "sse" && @env["HTTP_ACCEPT"].to_s.include?(Middleware::MSGPACK_TYPE)

      def headers(type)
        h = Middleware::REPLY_HEADERS.fetch(type).dup
        extra = extra_headers
        extra.each { |name, value| h[name] = value } unless extra.empty?
        h
      end

      # The extra-headers hook, once per request; names lowercased (Rack 3), unsafe values dropped. Replies
      # in MessagePack, which only Herald's client asks for, also name the store's epoch: a store reset whose
      # new ids are above the client's is noticed by it. message_bus's clients get the same bytes as from
      # message_bus.
      def extra_headers
        return @extra_headers ||= EMPTY unless @options[:extra_response_headers_lookup] || msgpack?
        @extra_headers ||= begin
          found = lookup(:extra_response_headers_lookup) || EMPTY
          out = found.each_with_object({}) do |(name, value), out|
            name = name.to_s.downcase
            value = value.to_s
            out[name] = value if name.match?(HEADER_SAFE) && value.match?(HEADER_SAFE) && !name.empty?
          end
          epoch = msgpack? && store_epoch
          expose_epoch(out, epoch) if epoch
          out
        end
      end

      # A page on another origin (the app's CORS headers allow it) can read the header only when it is exposed.
      def expose_epoch(out, epoch)
        out[EPOCH_HEADER] = epoch
        return unless out.key?("access-control-allow-origin")
        exposed = out["access-control-expose-headers"]
        out["access-control-expose-headers"] = exposed ? "#{exposed}, #{EPOCH_HEADER}" : EPOCH_HEADER
      end

      def store_epoch
        store = @transport.bus.store
        epoch = store.known_epoch.to_s
        epoch if epoch&.match?(EPOCH_SAFE)
      end

      def extra_header_lines
        return "" if extra_headers.empty?
        extra_headers.map { |name, value| "#{name}: #{value}\r\n" }.join.b
      end
    end
  end
end
