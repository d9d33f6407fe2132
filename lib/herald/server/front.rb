# frozen_string_literal: true

require "nio"
require "socket"
require "stringio"
require "puma/const" # Puma::HTTP_STATUS_CODES
require_relative "http_connection"
require_relative "puma_log"

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
      SERVER_SOFTWARE = "Herald"
      STATUS = Puma::HTTP_STATUS_CODES
      NO_BODY = [204, 304].freeze
      LINGER = 2 # seconds an answered error connection reads and discards before it is closed
      RACK_VERSION = [1, 6].freeze
      # Headers the front end writes itself (rack.* are not headers); content-length is kept when the app set it.
      FRAMING = /\A(?:rack\.|connection\z|transfer-encoding\z|content-length\z)/i

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
        @jobs = Thread::Queue.new
        @stopping = false
        @status_lines = {}
      end

      def start
        @listener = @reuse_port ? Server.reuse_port_listener(@host, @port) : TCPServer.new(@host, @port)
        @listener.listen(1024)
        @port = @listener.local_address.ip_port
        @server_port = @port.to_s
        @selector = NIO::Selector.new
        @selector.register(@listener, :r).value = :listener
        @workers = Array.new(@threads) { |i| worker(i) }
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
        @jobs.close
        deadline = now + 1 # after the grace period a pool thread still in the app is left behind
        @workers.each { |t| t.join([deadline - now, 0].max) }
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
        keep = keep_alive?(env)
        if @inline.call(env["REQUEST_PATH"] || absolute_path(env))
          found = cache_lookup(env, body) if @cache && keep && !@stopping
          return send_reply(conn, found, true) if found.is_a?(String)
          inline(conn, env, body, keep, found)
        else
          conn.busy = true
          conn.monitor.interests = nil
          @jobs << [conn, rack_env(conn, env, body), keep]
        end
      end

      # miss: a ReplyCache::Miss when the reply may be kept.
      def inline(conn, env, body, keep, miss)
        stamp = @cache.stamp if miss
        env = rack_env(conn, env, body)
        status, headers, rbody = call_app(env)
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

      def call_app(env)
        @app.call(env)
      rescue => e
        @log.unknown_error(e, env, "Rack app")
        error_response(500, ": the error is in the server's log")
      end

      # Puma's env, as far as the middleware and a Rack app need it (Rack 3 SPEC; rack.version for Rack 2).
      def rack_env(conn, env, body)
        path = env["REQUEST_PATH"]
        env["PATH_INFO"] = path || absolute_path(env)
        env["QUERY_STRING"] ||= ""
        env["SCRIPT_NAME"] = ""
        env["SERVER_NAME"], env["SERVER_PORT"] = server_name(env["HTTP_HOST"])
        env["REMOTE_ADDR"] = conn.remote_addr
        env["SERVER_SOFTWARE"] = SERVER_SOFTWARE
        env["rack.version"] = RACK_VERSION
        env["rack.url_scheme"] = "http"
        env["rack.input"] = StringIO.new(body)
        env["rack.errors"] = $stderr
        env["rack.multithread"] = true
        env["rack.multiprocess"] = false
        env["rack.run_once"] = false
        env["rack.hijack?"] = true
        env["rack.hijack"] = -> { hijack(conn, env) }
        env
      end

      # "GET http://host/path?q HTTP/1.1": Puma's parser leaves REQUEST_PATH out.
      def absolute_path(env)
        uri = env["REQUEST_URI"].to_s
        path = uri[%r{\A[a-z][a-z0-9+.-]*://[^/?#]*([^?#]*)}i, 1]
        raise HttpConnection::RequestRefused.new(400, "bad request target") if path.nil?
        path.empty? ? "/" : path
      end

      # SERVER_NAME and SERVER_PORT from the Host header; the last one is remembered (clients repeat it).
      def server_name(host)
        return @last_server_name if host == @last_host && host
        @last_host = host
        @last_server_name = parse_host(host)
      end

      def parse_host(host)
        return [@host, @server_port] if host.nil? || host.empty?
        if host.start_with?("[")
          name, port = host.split("]:", 2)
          return ["#{name.delete_suffix("]")}]", port || "80"]
        end
        name, port = host.split(":", 2)
        [name, port || "80"]
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

      def keep_alive?(env)
        connection = env["HTTP_CONNECTION"]
        http11 = env["SERVER_PROTOCOL"] == "HTTP/1.1"
        return http11 if connection.nil?
        if http11
          !connection.match?(/\bclose\b/i)
        else
          connection.match?(/\bkeep-alive\b/i)
        end
      end

      # Writes a response whose body is an Array (every middleware reply, most app replies) from the loop.
      def respond(conn, env, status, headers, body, keep)
        keep &&= !@stopping # the last reply of a stopping server says `connection: close`
        bytes = head(env, status, headers, body_length(body), keep)
        unless env["REQUEST_METHOD"] == "HEAD" || NO_BODY.include?(status)
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

      def body_length(body)
        return nil unless body.is_a?(Array)
        body.sum(&:bytesize)
      end

      # Status line and headers. Rack 3 values may hold several lines ("a\nb"); rack.* keys are not headers.
      def head(env, status, headers, length, keep, chunked: false)
        version = (env["SERVER_PROTOCOL"] == "HTTP/1.0") ? "HTTP/1.0" : "HTTP/1.1"
        out = +(@status_lines[[version, status]] ||= "#{version} #{status} #{STATUS[status] || "CUSTOM"}\r\n".b.freeze)
        has_length = false
        headers.each do |name, value|
          name = name.to_s
          if FRAMING.match?(name)
            key = name.downcase
            next unless key == "content-length"
            has_length = true
          end
          if value.is_a?(String) && !value.include?("\n")
            out << name << ": " << value << "\r\n"
          else
            (value.is_a?(Array) ? value : value.to_s.split("\n")).each { |line| out << name << ": " << line.to_s << "\r\n" }
          end
        end
        out << "content-length: " << length.to_s << "\r\n" if length && !has_length && !NO_BODY.include?(status)
        out << "transfer-encoding: chunked\r\n" if chunked
        if !keep
          out << "connection: close\r\n"
        elsif version == "HTTP/1.0"
          out << "connection: keep-alive\r\n"
        end
        out << "\r\n"
      end

      # A request that cannot be served: a short text answer, then the connection is closed (after reading
      # and discarding for LINGER seconds what the client still sends, so the answer is not lost to a reset).
      def refuse(conn, status, message)
        Herald.logger.debug("http server: request refused (#{status}): #{message.to_s.scrub[0, 200]}")
        _, headers, body = error_response(status)
        bytes = head({"SERVER_PROTOCOL" => "HTTP/1.1"}, status, headers, body_length(body), false)
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

      def error_response(status, detail = "")
        [status, {"content-type" => "text/plain; charset=utf-8"}, ["#{status} #{STATUS[status]}#{detail}\n"]]
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

      # Pool threads: the app runs here; an Array body goes back to the loop to be written, a streaming
      # body is written from this thread (blocking) and the connection then goes back to the loop.
      def worker(index)
        Thread.new do
          Thread.current.name = "herald-app-#{index}" if Thread.current.respond_to?(:name=)
          while (job = @jobs.pop)
            @inbox << run_job(*job)
            wakeup
          end
        end
      end

      # What goes back to the loop: the reply to write, or how the connection ends.
      def run_job(conn, env, keep)
        status, headers, body = call_app(env)
        return [conn, :hijacked] if env[Rack::EnvKeys::HIJACKED]
        return [conn, env, status, headers, body, keep] if body.is_a?(Array)
        [conn, stream(conn, env, status, headers, body, keep)]
      rescue => e # a body that fails while streaming: the connection ends, the thread stays
        @log.unknown_error(e, env, "Rack app")
        [conn, false]
      end

      # A body that is not an Array (an app streaming): chunked on HTTP/1.1 unless the app gave a length;
      # on HTTP/1.0 without a length the connection closes to end it.
      def stream(conn, env, status, headers, body, keep)
        bodyless = env["REQUEST_METHOD"] == "HEAD" || NO_BODY.include?(status)
        length = headers.any? { |k, _| k.to_s.casecmp("content-length") == 0 }
        chunked = !bodyless && !length && env["SERVER_PROTOCOL"] == "HTTP/1.1"
        keep &&= bodyless || length || chunked
        return callable_body(conn, env, status, headers, body) if !body.respond_to?(:each) && body.respond_to?(:call)
        conn.io.write(head(env, status, headers, nil, keep, chunked: chunked))
        unless bodyless
          body.each do |part|
            next if part.empty?
            conn.io.write(chunked ? "#{part.bytesize.to_s(16)}\r\n#{part}\r\n" : part)
          end
          conn.io.write("0\r\n\r\n") if chunked
        end
        keep
      rescue IOError, SystemCallError
        false
      ensure
        body.close if body.respond_to?(:close)
      end

      # A Rack 3 streaming body (#call with the stream): it writes what it likes; the connection closes after.
      def callable_body(conn, env, status, headers, body)
        conn.io.write(head(env, status, headers, nil, false))
        body.call(conn.io)
        false
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
