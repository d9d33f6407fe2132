# frozen_string_literal: true

require "nio"
require "socket"
require_relative "http_connection"
require_relative "puma_log"
require_relative "rack_env"
require_relative "response_head"
require_relative "app_pool"

module Herald
  class Server
    # `herald server`'s HTTP front end: one event loop thread (nio4r) accepts connections, reads them
    # without blocking and parses requests with Puma's C parser (HttpConnection). A request whose path
    # `inline` accepts (the middleware's `message-bus/` prefix) is answered on the loop itself: a poll is
    # a few dozen microseconds of Ruby, shorter than handing it to a thread. A parked poll, stream or SSE
    # client is fully hijacked by the middleware, whose own event loop (Herald::Rack::Reactor) holds it.
    # Every other request (the demo page, an app's routes) is built into the same Rack env and run on a
    # small thread pool, so a slow app never holds up the polls; its reply goes back to the loop to write.
    #
    # HTTP/1.1 keep-alive and pipelining (requests answered in order, one at a time per connection),
    # Content-Length and chunked bodies up to max_request_bytes (413 over it, before the body is read),
    # Puma's parser limits (414 for the request target, 431 for the header section, 400 for the rest),
    # RFC 9112 framing checked strictly (HttpConnection: 400, 501 or 505, then closed), and a whole request
    # within `timeout` seconds (slowloris): an idle or stalled connection is closed after it (408 when a
    # request was under way).
    #
    # #stop is graceful: the listener closes at once (new connections are refused), no new request is
    # read, and the loop keeps running until every request the pool holds is answered and its reply
    # written (`connection: close`), within the grace period. Every other connection is ended with a FIN
    # (its unread bytes discarded until the client closes, so no reset destroys a reply in flight).
    class Front
      TICK = 0.5 # longest select: how often timeouts are checked at the latest
      ACCEPTS = 64 # connections accepted per wakeup, so a flood of connects never starves the others
      LINGER = 2 # seconds an answered error connection reads and discards before it is closed

      attr_reader :port

      # app: the Rack app (the middleware, with the demo app or an app behind it).
      # inline: ->(path) { true for requests answered on the event loop }.
      # cache: a Rack::ReplyCache for inline requests (nil: none). reuse_port: listen with SO_REUSEPORT (worker
      # processes on one port, Server.reuse_port_listener).
      def initialize(app:, inline:, host:, port:, threads:, max_request_bytes:, timeout: 10, cache: nil, reuse_port: false)
        @app = app
        @reuse_port = reuse_port
        @inline = inline
        @cache = cache
        @host = host
        @port = port
        @threads = threads
        @max_body = max_request_bytes
        @timeout = timeout
        @log = PumaLog.new
        @conns = {}.compare_by_identity # every connection this loop holds (not the hijacked ones)
        @inbox = Thread::Queue.new # finished pool requests
        @head = ResponseHead.new
        @stopping = false
      end

      def start
        @listener = @reuse_port ? Server.reuse_port_listener(@host, @port) : TCPServer.new(@host, @port)
        @listener.listen(1024)
        @port = @listener.local_address.ip_port
        @rack_env = RackEnv.new(host: @host, port: @port, hijacker: self)
        @selector = NIO::Selector.new
        @selector.register(@listener, :r).value = :listener
        @pool = AppPool.new(app: @app, threads: @threads, head: @head, log: @log, done: method(:pooled))
        @thread = Thread.new { run }
        @thread.name = "herald-http" if @thread.respond_to?(:name=)
        self
      end

      # Graceful: stops accepting and reading requests, answers what the pool holds (up to `grace`
      # seconds), then closes every connection. Returns once the loop and the pool threads are done.
      def stop(grace: 5)
        return unless @thread
        @grace = grace
        @stopping = true
        wakeup
        @thread.join(grace + LINGER + 1)
        @pool.stop(now + 1) # after the grace period a pool thread still in the app is left behind
      end

      # The middleware takes the socket (a parked poll, a stream): this loop forgets it. It may run on a
      # pool thread (an app that hijacks), so the selector is only touched from the loop.
      def hijack(conn, env)
        env[Rack::EnvKeys::HIJACKED] = true
        env["rack.hijack_io"] = conn.io
        if Thread.current.equal?(@thread)
          @conns.delete(conn)
          conn.monitor&.close
        else
          conn.close_after = :hijacked
        end
        conn.io
      end

      private

      def run
        until @stopping && wound_down?
          wind_down if @stopping && !@winding
          @selector.select(TICK) { |monitor| ready(monitor) }
          finish_pooled until @inbox.empty?
          sweep
        end
      rescue => e
        Herald.logger.error("http server: event loop: #{e.class}: #{e.message} (#{e.backtrace&.first})")
        retry unless @stopping && wound_down?
      ensure
        shutdown if @stopping
      end

      # The start of a graceful stop, on the loop: no new connection, no new request. A connection whose
      # request is with the pool keeps its place until the reply is written (after_reply ends it).
      def wind_down
        @winding = true
        @stop_deadline = now + (@grace || 5)
        accept_pending # the kernel's queue: ended below with a FIN, where closing the listener would reset them
        close_listener
        @conns.each_key.to_a.each { |conn| quit(conn) unless conn.busy || conn.writing? || conn.draining }
      end

      def accept_pending
        loop do
          before = @conns.size
          accept
          break if @listener_paused || @conns.size - before < ACCEPTS
        end
      end

      # Done when every connection is closed (replies written, clients gone), or the grace period is over.
      def wound_down? = @winding && (@conns.empty? || now >= @stop_deadline)

      def close_listener
        @selector.deregister(@listener) unless @listener_paused || @listener.closed?
      rescue IOError
        nil # the selector is closed already
      ensure
        @listener.close
      end

      # Ends a connection gracefully: FIN now; what the client still sends is read and dropped until it
      # closes (or LINGER seconds), since closing with unread bytes would reset the connection.
      def quit(conn)
        return close(conn) if conn.eof?
        conn.draining = true
        conn.close_after = true
        conn.monitor.interests = :r
        linger(conn)
      end

      # On a pool thread: the reply goes to the loop.
      def pooled(reply)
        @inbox << reply
        wakeup
      end

      # A pool thread hands back a reply; the loop may have closed its selector by then (a graceful
      # stop's grace period over, or the loop gone): nothing is waiting for the wakeup.
      def wakeup
        @selector.wakeup
      rescue IOError
        nil
      end

      def ready(monitor)
        return accept if monitor.value == :listener
        conn = monitor.value
        flushed(conn) if monitor.writable? && conn.writing?
        return unless monitor.readable? && @conns.key?(conn) && !conn.busy
        open = conn.read
        return (open ? nil : close(conn)) if conn.draining
        serve(conn)
      rescue => e
        Herald.logger.error("http server: connection: #{e.class}: #{e.message} (#{e.backtrace&.first})")
        close(conn)
      end

      def accept
        ACCEPTS.times do
          io = @listener.accept_nonblock(exception: false)
          return if io == :wait_readable
          io.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
          conn = HttpConnection.new(io, timeout: @timeout, max_body: @max_body)
          conn.monitor = @selector.register(io, :r)
          conn.monitor.value = conn
          @conns[conn] = true
        end
      rescue IOError, SystemCallError => e
        # EMFILE and the like: the connection waits in the backlog. The listener stays readable, so it is
        # left out of the select until the next sweep instead of waking the loop over and over.
        Herald.logger.warn("http server: accept: #{e.class}: #{e.message}")
        @listener_paused = true
        @selector.deregister(@listener)
      end

      # Answers the complete requests in the buffer, in order; stops at one that goes to the pool (its
      # reply comes back through the inbox) or while a reply is still being written.
      def serve(conn)
        return quit(conn) if @winding
        until conn.busy || conn.writing? || conn.draining || !@conns.key?(conn)
          request = conn.next_request
          unless request
            conn.write("HTTP/1.1 100 Continue\r\n\r\n") if conn.continue?
            return close(conn) if conn.eof? && !conn.writing?
            return
          end
          dispatch(conn, *request)
        end
      rescue HttpConnection::RequestRefused => e
        refuse(conn, e.status, e.message)
      end

      def dispatch(conn, env, body)
        keep = @rack_env.keep_alive?(env)
        if @inline.call(@rack_env.path(env))
          found = cache_lookup(env, body) if @cache && keep && !@stopping
          return send_reply(conn, found, true) if found.is_a?(String)
          inline(conn, env, body, keep, found)
        else
          conn.busy = true
          conn.monitor.interests = nil
          @pool << [conn, @rack_env.build(conn, env, body), keep]
        end
      end

      # miss: a ReplyCache::Miss when the reply may be kept.
      def inline(conn, env, body, keep, miss)
        stamp = @cache.stamp if miss
        env = @rack_env.build(conn, env, body)
        status, headers, rbody = @pool.call_app(env)
        return if env[Rack::EnvKeys::HIJACKED]
        bytes = respond(conn, env, status, headers, rbody, keep)
        shared = env[Rack::EnvKeys::SHARED_REPLY] # the number of messages in the reply
        @cache.store(miss, bytes.dup.freeze, stamp, shared) if miss && status == 200 && shared
      end

      # The ReplyCache's whole HTTP reply for a repeated poll (a String), a ReplyCache::Miss, or nil.
      def cache_lookup(env, body)
        return nil if Instrumentation.listening?(Rack::Responder::POLL) # every such poll gets its event
        path = env["REQUEST_PATH"] or return nil # an absolute request target: not worth a key
        @cache.lookup_path(env, path, body)
      end

      # Writes a response whose body is an Array (every middleware reply, most app replies) from the loop.
      def respond(conn, env, status, headers, body, keep)
        keep &&= !@stopping # the last reply of a stopping server says `connection: close`
        bytes = @head.call(env, status, headers, ResponseHead.body_length(body), keep)
        unless ResponseHead.bodyless?(env, status)
          body.each { |part| bytes << part }
        end
        body.close if body.respond_to?(:close)
        send_reply(conn, bytes, keep)
        bytes
      end

      def send_reply(conn, bytes, keep)
        conn.close_after = true unless keep
        if conn.write(bytes)
          after_reply(conn)
        else
          conn.monitor.interests = :w # nothing more is read until the reply is out (bounded buffers)
        end
      end

      def after_reply(conn)
        return close(conn) if conn.eof?
        return quit(conn) if @winding
        return close(conn) if conn.close_after
        serve(conn) unless conn.busy
      end

      def flushed(conn)
        return unless conn.flush
        conn.monitor.interests = :r
        conn.draining ? linger(conn) : after_reply(conn)
      end

      # A request that cannot be served: a short text answer, then the connection is closed (after reading
      # and discarding for LINGER seconds what the client still sends, so the answer is not lost to a reset).
      def refuse(conn, status, message)
        Herald.logger.debug("http server: request refused (#{status}): #{message.to_s.scrub[0, 200]}")
        _, headers, body = ResponseHead.error_response(status)
        bytes = @head.call({"SERVER_PROTOCOL" => "HTTP/1.1"}, status, headers, ResponseHead.body_length(body), false)
        body.each { |part| bytes << part }
        conn.draining = true
        conn.close_after = true
        return conn.monitor.interests = :w unless conn.write(bytes)
        linger(conn)
      end

      def linger(conn)
        conn.io.shutdown(Socket::SHUT_WR)
        conn.extend_deadline(LINGER)
      rescue IOError, SystemCallError
        close(conn)
      end

      # Timeouts: a request not complete in time (408), an idle keep-alive connection, a client that takes
      # no bytes, an answered error connection done lingering.
      def sweep
        time = now
        return if @next_sweep && time < @next_sweep
        @next_sweep = time + TICK
        resume_accepting if @listener_paused && !@winding
        expired = @conns.each_key.select { |conn| !conn.busy && conn.deadline <= time }
        expired.each do |conn|
          if conn.draining || conn.writing? || conn.idle?
            close(conn)
          else
            refuse(conn, 408, "request not complete within #{@timeout}s")
          end
        end
      end

      def resume_accepting
        @listener_paused = false
        @selector.register(@listener, :r).value = :listener
      end

      def close(conn)
        @conns.delete(conn)
        conn.close
      end

      def finish_pooled
        conn, *rest = @inbox.pop
        if rest.first == :hijacked || conn.close_after == :hijacked
          @conns.delete(conn)
          return conn.monitor&.close
        end
        conn.busy = false
        return close(conn) unless @conns.key?(conn)
        conn.monitor.interests = :r
        if rest.size == 1
          return rest.first ? after_reply(conn) : close(conn)
        end
        env, status, headers, body, keep = rest
        respond(conn, env, status, headers, body, keep)
      rescue => e
        Herald.logger.error("http server: reply: #{e.class}: #{e.message} (#{e.backtrace&.first})")
        close(conn)
      end

      # After the grace period a connection still with the pool is closed too: its thread finds the
      # selector closed (wakeup) and the reply goes nowhere.
      def shutdown
        close_listener
        @conns.each_key.to_a.each { |conn| close(conn) }
        @selector.close
      rescue IOError, SystemCallError
        nil
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
