# frozen_string_literal: true

begin
  require "puma"
rescue LoadError
  # Puma is optional for the library (apps bring their own server): only `herald server` needs it.
  raise LoadError, "herald server needs the puma gem (>= 6.4): add `gem \"puma\"` to your Gemfile (or gem install puma)"
end
require "puma/server"
require "puma/log_writer"
require_relative "../herald"
require_relative "server/demo_app"
require_relative "server/puma_log"
require_relative "server/workers"
require_relative "server/front"

module Herald
  # `herald server`: Herald::Rack::Middleware in front of the demo page, on the embedded log store, behind
  # Herald's own HTTP front end (Front): one event loop reads and parses every connection (Puma's C parser)
  # and answers message-bus requests itself; parked polls, streams and SSE go to the middleware's event loop
  # (rack.hijack); the demo page and anything else run on a few threads. `front: :puma` (`herald server
  # --puma`) puts Puma in front of the middleware instead, as an app embedding Herald does.
  #
  #   server = Herald::Server.new(port: 0, dir: "tmp/herald", user_id_lookup: ->(env) { ... })
  #   server.start          # listening; server.port tells the port when 0 was asked
  #   server.wait           # until SIGTERM / SIGINT (or #stop from another thread)
  class Server
    DEFAULT_HOST = "127.0.0.1"
    DEFAULT_PORT = 9292
    DEFAULT_DIR = Store::Log::DEFAULT_DIR
    DEFAULT_THREADS = 5 # Puma's default; poll replies are short and CPU-bound, 2 cores
    # Puma keeps a request body up to this size in memory and writes a larger one to a temporary file, from
    # its one reactor thread, before the app sees it: on a busy disk, a megabyte upload stalled every request
    # still being read for over 10 s. Herald's endpoints take 64 KiB (max_body_bytes), so a larger body is
    # answered 413 before it is read.
    DEFAULT_MAX_REQUEST_BYTES = Puma::Const::MAX_BODY
    # :herald, Herald's own front end (Front: polls answered on an event loop, the rest on a thread pool);
    # :puma, Puma in front of the middleware (as an app embeds Herald).
    FRONTS = %i[herald puma].freeze
    DEFAULT_FRONT = :herald

    attr_reader :bus, :host

    # `app:` (a callable (demo_app, bus) => Rack app) wraps the demo app, e.g. with an app's own routes.
    # `front:` :herald (Front) or :puma; `reply_cache: false` turns off the reply caches of Front and of the
    # middleware (benchmarks: every poll built).
    # Keyword options other than those below go to Herald::Rack::Middleware (user_id_lookup:,
    # group_ids_lookup:, site_id_lookup:, ...), so an app can embed this server with its own lookups.
    def initialize(host: DEFAULT_HOST, port: DEFAULT_PORT, dir: DEFAULT_DIR, store: nil, bus: nil,
      threads: DEFAULT_THREADS, log: $stdout, app: nil, max_request_bytes: nil, front: DEFAULT_FRONT, reply_cache: true,
      reuse_port: false, **middleware_options)
      @host = host
      @reuse_port = reuse_port # SO_REUSEPORT: worker processes each listen on the same port (Server.reuse_port_listener)
      @front = front
      @reply_cache = reply_cache
      @port = port
      @threads = threads
      @max_request_bytes = max_request_bytes || [DEFAULT_MAX_REQUEST_BYTES, middleware_options[:max_body_bytes].to_i].max
      validate_options!
      @log = log
      @bus = bus || Bus.new(store: store || Store::Log.new(dir: dir))
      @owns_bus = bus.nil?
      inner = DemoApp.new(bus: @bus)
      inner = app.call(inner, @bus) if app
      @middleware = Rack::Middleware.new(inner, bus: @bus, reply_cache: reply_cache, **middleware_options)
      @stop = Queue.new
    end

    def app = @middleware

    # What Puma answers when the app raised (500) or a request could not be read (400, 501): a short text
    # instead of an empty body. The error itself goes to Herald.logger (PumaLog). Puma 6.6 raises more than
    # its parser error on some malformed requests (a bare "\r\n\r\n": puma/puma#3985; a chunk shorter than
    # its size line; a huge chunk size) and would answer 500: whatever fails while Puma reads a request,
    # before the app runs (no "puma.socket" in the env yet), is the request's fault, a 400.
    LOWLEVEL_ERROR = lambda do |_error, env, status|
      status = 400 if status == 500 && !(env.is_a?(Hash) && env.key?("puma.socket"))
      detail = (status >= 500) ? ": the error is in the server's log" : ""
      [status, {"content-type" => "text/plain; charset=utf-8"}, ["#{status} #{Puma::HTTP_STATUS_CODES[status]}#{detail}\n"]]
    end

    # One Puma configuration for `herald server` and for the peers it is measured against (bench/).
    def self.build_puma(app, host:, port:, threads:, max_request_bytes: DEFAULT_MAX_REQUEST_BYTES, reuse_port: false)
      puma = Puma::Server.new(app, nil,
        min_threads: threads, max_threads: threads, log_writer: PumaLog.new, lowlevel_error_handler: LOWLEVEL_ERROR,
        environment: "production", queue_requests: true, http_content_length_limit: max_request_bytes)
      if reuse_port
        puma.binder.inherit_tcp_listener(host, port, reuse_port_listener(host, port))
      else
        puma.add_tcp_listener(host, port, true, 1024)
      end
      puma.binder.ios.each { |listener| listener.extend(ClosedListener) }
      puma
    end

    # Puma (6.6) writes a reply on a busy pool only after asking the request's listener whether a connection
    # waits (`client.listener.to_io.wait_readable(0)`); its graceful stop closes the listeners while requests
    # are still being answered, and the IOError lost the reply of a request that had run (a publish
    # acknowledged to nobody). A closed listener has no connection waiting.
    module ClosedListener
      def wait_readable(*)
        super
      rescue IOError
        nil
      end
    end

    # A listening socket with SO_REUSEPORT: several processes bind the same port and the kernel spreads new
    # connections over them by address hash, so worker processes share the parked clients evenly (a shared
    # inherited socket hands them to whichever process wakes first).
    def self.reuse_port_listener(host, port)
      address = Addrinfo.tcp(host, port)
      socket = Socket.new(address.afamily, :STREAM)
      socket.setsockopt(:SOCKET, :REUSEADDR, true)
      socket.setsockopt(:SOCKET, :REUSEPORT, true)
      socket.setsockopt(:TCP, :NODELAY, true)
      socket.bind(address)
      socket.listen(1024)
      socket.autoclose = false
      TCPServer.for_fd(socket.fileno)
    end

    def start
      if @front == :herald
        cache = Rack::ReplyCache.new(store: @bus.store, prefix: @middleware.prefix) if @reply_cache
        @server = listen do
          Front.new(app: @middleware, inline: inline_paths, host: @host, port: @port, threads: @threads,
            max_request_bytes: @max_request_bytes, cache: cache, reuse_port: @reuse_port).start
        end
        @port = @server.port
        @log&.puts "Herald listening on #{url} (Herald's event loop, Puma's parser #{Puma::Const::PUMA_VERSION}, #{@threads} app threads)"
      else
        @puma = listen { Server.build_puma(@middleware, host: @host, port: @port, threads: @threads, max_request_bytes: @max_request_bytes, reuse_port: @reuse_port) }
        @port = @puma.connected_ports.first
        @thread = @puma.run
        @log&.puts "Herald listening on #{url} (Puma #{Puma::Const::PUMA_VERSION}, #{@threads} threads)"
      end
      @log&.flush
      self
    end

    attr_reader :port

    def url = "http://#{@host.include?(":") ? "[#{@host}]" : @host}:#{@port}" # [::1]: IPv6 in a URL

    # Blocks until SIGTERM/SIGINT or #stop, then shuts down: Puma finishes the requests in flight, the
    # middleware closes its parked connections, the bus flushes and closes the store.
    def wait
      previous = %w[TERM INT].to_h { |sig| [sig, trap(sig) { @stop << sig }] }
      signal = @stop.pop
      @log&.puts "Herald stopping (#{signal})"
      @log&.flush
      shutdown
    ensure
      previous&.each { |sig, handler| trap(sig, handler || "DEFAULT") }
    end

    def stop = @stop << "stop"

    def run
      start
      wait
    end

    private

    # Message-bus requests (not herald.js, a file the thread pool serves as well) run on the event loop when
    # the store answers from this process's memory (the log, Memory): a poll is then a few microseconds of
    # Ruby. With a networked store (Redis, PostgreSQL) a poll waits for a round trip, so polls run on the
    # thread pool, which waits for several at once, and the loop only reads and writes.
    def inline_paths
      return ->(_path) { false } unless @bus.store.local_reads?
      prefix = @middleware.prefix
      script = "#{prefix}herald.js"
      ->(path) { path.start_with?(prefix) && path != script }
    end

    def listen
      yield
    rescue Errno::EADDRINUSE
      shutdown
      raise ConfigurationError, "cannot listen on #{@host}: port #{@port} is in use; stop the other server or pass --port"
    rescue Errno::EACCES, Errno::EADDRNOTAVAIL, SocketError => e
      shutdown
      raise ConfigurationError, "cannot listen on #{@host} port #{@port} (#{e.message}); pass another --host or --port"
    end

    # Puma takes a port modulo 65536, binds every interface for an empty host and, with no threads,
    # accepts connections it never answers.
    def validate_options!
      raise InvalidArgumentError, "host must name an address (0.0.0.0 for every interface), got #{@host.inspect}" unless @host.is_a?(String) && !@host.empty?
      raise InvalidArgumentError, "port must be an Integer in 0..65535 (0: any free port), got #{@port.inspect}" unless @port.is_a?(Integer) && @port.between?(0, 65_535)
      raise InvalidArgumentError, "threads must be an Integer >= 1, got #{@threads.inspect}" unless @threads.is_a?(Integer) && @threads >= 1
      raise InvalidArgumentError, "front must be one of #{FRONTS.inspect}, got #{@front.inspect}" unless FRONTS.include?(@front)
    end

    def shutdown
      @puma&.stop(true)
      @server&.stop
      @middleware.close if @middleware.respond_to?(:close)
      @bus.close if @owns_bus
    end
  end
end
