# frozen_string_literal: true

require "test_helper"
require "json"
require "socket"
require "rack"
require "rack/lint"
require "rack/mock"

module Herald
  # Shared by the transport tests: a bus on the memory store, the middleware through Rack::Lint
  # (Rack::MockRequest), and a real Puma on a free port for the socket paths.
  module RackHelpers
    JSON_TYPE = "application/json"
    FORM_TYPE = "application/x-www-form-urlencoded"
    APP = ->(_env) { [200, {"content-type" => "text/plain"}, ["the app"]] }

    def setup
      @bus = Herald::Bus.new(store: Herald::Store::Memory.new)
      @middlewares = []
      @servers = []
    end

    def teardown
      @servers.each(&:stop)
      @middlewares.each(&:close)
      @bus.close
    end

    def middleware(**options)
      Herald::Rack::Middleware.new(APP, bus: @bus, long_polling_interval: 0.5, **options).tap { |mw| @middlewares << mw }
    end

    def mock(mw = middleware) = ::Rack::MockRequest.new(::Rack::Lint.new(mw))

    # A poll through Rack::Lint (as HTTP/1.1: rack 2's MockRequest leaves SERVER_PROTOCOL out); body is a Hash (sent as JSON) or a String (sent as given).
    def poll(mock, body = {}, client: "c1", query: nil, type: nil, **env)
      input = body.is_a?(Hash) ? JSON.generate(body) : body
      type ||= body.is_a?(Hash) ? JSON_TYPE : FORM_TYPE
      path = "/message-bus/#{client}/poll#{"?#{query}" if query}"
      mock.post(path, {:input => input, "CONTENT_TYPE" => type, "SERVER_PROTOCOL" => "HTTP/1.1"}.merge(env.transform_keys(&:to_s)))
    end

    def in_thread(&block)
      Thread.new(&block).tap { |t| t.report_on_exception = false }
    end

    def parked(mw, count = 1)
      eventually(message: "expected #{count} parked clients") { mw.active_clients == count }
    end

    # Splits a streamed body on the separator, un-escapes, parses each JSON array.
    def segments(body)
      body.split(Herald::Rack::Wire::SEPARATOR).map { |s| JSON.parse(s.gsub("\r\n||\r\n", "\r\n|\r\n")) }
    end

    def ids(messages) = messages.reject { |m| m["channel"] == "/__status" }.map { |m| m["data"] }

    def status_of(messages) = messages.find { |m| m["channel"] == "/__status" }&.fetch("data")

    # HERALD_TEST_FRONT=herald: the socket tests run against herald server's own front end
    # (Herald::Server::Front) instead of Puma, with the same middleware behind it.
    def puma(mw = middleware)
      server = (ENV["HERALD_TEST_FRONT"] == "herald") ? FrontServer.new(mw) : PumaServer.new(mw)
      server.tap { |s| @servers << s }
    end
  end

  # Puma in this process on a free port, spoken to over raw sockets.
  class PumaServer
    require "puma"
    require "puma/server"
    require "puma/log_writer"

    attr_reader :port

    def initialize(app, threads: 4)
      @puma = Puma::Server.new(app, nil, min_threads: 1, max_threads: threads, log_writer: Puma::LogWriter.null)
      @puma.add_tcp_listener("127.0.0.1", 0)
      @puma.run
      @port = @puma.connected_ports.first
    end

    def stop = @puma.stop(true)

    # Sends a raw HTTP/1.1 request; returns the socket.
    # rcvbuf: a small receive buffer, set before connecting (a stalled reader fills up sooner).
    def request(body, client: "c1", path: nil, method: "POST", type: "application/json", headers: {}, version: "HTTP/1.1", rcvbuf: nil)
      body = JSON.generate(body) if body.is_a?(Hash)
      path ||= "/message-bus/#{client}/poll"
      socket = connect(rcvbuf)
      head = "#{method} #{path} #{version}\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      head << "Content-Type: #{type}\r\n" if type
      head << "Content-Length: #{body.bytesize}\r\n"
      headers.each { |k, v| head << "#{k}: #{v}\r\n" }
      socket.write(head << "\r\n" << body)
      socket
    end

    def connect(rcvbuf)
      return TCPSocket.new("127.0.0.1", @port) unless rcvbuf
      socket = Socket.new(:INET, :STREAM)
      socket.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, rcvbuf)
      socket.connect(Socket.sockaddr_in(@port, "127.0.0.1"))
      socket
    end

    # Reads a whole response (the server closes). Returns [status, headers (lowercase names), raw body].
    def self.read(socket, timeout: 5) = parse(read_raw(socket, timeout: timeout))

    # Everything until the server closes.
    def self.read_raw(socket, timeout: 5)
      raw = +""
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise "response not finished within #{timeout}s: ...#{raw[-200..].inspect}" if left <= 0
        next unless socket.wait_readable(left)
        chunk = socket.read_nonblock(65_536, exception: false)
        break if chunk.nil?
        raw << chunk unless chunk == :wait_readable
      end
      raw
    ensure
      socket.close
    end

    def self.parse(raw)
      head, body = raw.split("\r\n\r\n", 2)
      lines = head.split("\r\n")
      status = lines.shift[/\AHTTP\/1\.\d (\d+)/, 1].to_i
      headers = lines.map { |l| l.split(": ", 2) }.map { |k, v| [k.downcase, v] }
      [status, headers, body]
    end

    # Decodes chunked framing; returns the chunks' payloads.
    def self.dechunk(body)
      chunks = []
      rest = body.b
      loop do
        size_line, rest = rest.split("\r\n", 2)
        size = size_line.to_i(16)
        break if size == 0
        chunks << rest.byteslice(0, size)
        raise "bad chunk framing" unless rest.byteslice(size, 2) == "\r\n"
        rest = rest.byteslice(size + 2, rest.bytesize)
      end
      chunks
    end

    # Reads until `bytes` is seen (for streams still open); returns everything read.
    def self.read_until(socket, pattern, timeout: 5)
      buffer = +""
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      until buffer.include?(pattern)
        left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise "#{pattern.inspect} not seen within #{timeout}s: ...#{buffer[-200..].inspect}" if left <= 0
        next unless socket.wait_readable(left)
        chunk = socket.read_nonblock(65_536, exception: false)
        raise "closed before #{pattern.inspect}: ...#{buffer[-200..].inspect}" if chunk.nil?
        buffer << chunk unless chunk == :wait_readable
      end
      buffer
    end
  end
end

module Herald
  # `herald server`'s front end in this process on a free port, with the same raw-socket helpers: requests
  # under /message-bus/ answered on its event loop, the rest on its thread pool.
  class FrontServer < PumaServer
    def initialize(app, threads: 4)
      require "herald/server"
      inline = ->(path) { path.start_with?("/message-bus/") }
      @front = Herald::Server::Front.new(app: app, inline: inline, host: "127.0.0.1", port: 0, threads: threads,
        max_request_bytes: Herald::Server::DEFAULT_MAX_REQUEST_BYTES).start
      @port = @front.port
    end

    def stop = @front.stop
  end
end
