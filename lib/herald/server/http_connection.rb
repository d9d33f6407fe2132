# frozen_string_literal: true

require "puma/puma_http11" # Puma::HttpParser, Puma::HttpParserError

module Herald
  class Server
    # One client connection of Front: the bytes read so far, Puma's C parser (Puma::HttpParser: the
    # request line and headers, with its length limits), the body (Content-Length or chunked), and the
    # bytes the kernel has not taken yet. Front's event loop drives it; nothing here blocks.
    #
    # #next_request returns nil (more bytes needed) or a complete request [env, body]; a request that
    # cannot be served raises RequestRefused with the status to answer (the connection is closed after it).
    class HttpConnection
      include Herald::Rack::PendingWrites

      RequestRefused = Class.new(StandardError) do
        attr_reader :status

        def initialize(status, message)
          @status = status
          super(message)
        end
      end

      READ_SIZE = 16 * 1024
      CRLF = "\r\n"
      LENGTH = /\A\d{1,18}\z/
      CHUNK_SIZE = /\A\h{1,15}\z/

      attr_reader :io, :deadline, :pending_bytes
      attr_accessor :monitor, :busy, :close_after, :draining

      def initialize(io, timeout:, max_body:)
        @io = io
        @timeout = timeout # seconds to send a whole request (slowloris), or to send the next one
        @max_body = max_body
        @parser = Puma::HttpParser.new
        @buffer = +"".b
        @pending = nil # strings not yet taken by the kernel (PendingWrites)
        @pending_bytes = 0
        @busy = false # the request is with the thread pool: read nothing more until it answers
        @close_after = false # close once the reply is out
        @draining = false # answered an error: discard what the client still sends, then close
        @eof = false
        @scratch = +"".b # read_nonblock's buffer, reused: a fresh 16 KiB string per read costs more than the parse
        @deadline = now + timeout
        reset
      end

      def eof? = @eof

      # The peer's address, once per connection (a getpeername).
      def remote_addr
        @remote_addr ||= @io.remote_address.ip_address
      rescue SystemCallError, SocketError
        @remote_addr = "127.0.0.1"
      end

      def writing? = !@pending.nil?

      def idle? = @buffer.empty? && !@head

      # Reads what the socket has. False when the peer closed (or the socket failed).
      def read
        data = @io.read_nonblock(READ_SIZE, @scratch, exception: false)
        return true if data == :wait_readable
        if data.nil?
          @eof = true
          return false
        end
        return true if @draining
        @deadline = now + @timeout if idle?
        @buffer << data
        true
      rescue IOError, SystemCallError
        @eof = true
        false
      end

      # The next complete request in the buffer: [env, body], or nil until more bytes come.
      def next_request
        return nil if @buffer.empty?
        parse_head unless @head
        return nil unless @head
        body = @chunked ? chunked_body : fixed_body
        return nil unless body
        env = @env
        reset
        @deadline = now + @timeout
        [env, body]
      end

      # HTTP/1.1 100 Continue, once, to a client that waits for it before it sends its body.
      def continue?
        return false if @continued || !@head || @env["HTTP_EXPECT"].to_s.casecmp("100-continue") != 0
        @continued = true
      end

      # Bytes for the client; never blocks. True when the kernel took everything.
      def write(bytes)
        queued = !@pending.nil?
        return true if write_or_queue(bytes)
        @deadline = now + @timeout unless queued
        false
      rescue IOError, SystemCallError
        @eof = true
        @pending = nil
        true
      end

      # The socket turned writable. True when everything is out.
      def flush
        drain { @deadline = now + @timeout }
      rescue IOError, SystemCallError
        @eof = true
        @pending = nil
        true
      end

      def extend_deadline(seconds) = (@deadline = now + seconds)

      def close
        @monitor&.close
        @io.close
      rescue IOError, SystemCallError
        nil
      end

      private

      def reset
        @parser.reset
        @env = {}
        @nread = 0
        @head = false
        @chunked = false
        @length = 0
        @continued = false
        @decoded = nil
        @scan = 0
      end

      def parse_head
        @nread = @parser.execute(@env, @buffer, @nread)
        return unless @parser.finished?
        @head = true
        @head_size = @nread
        framing
      rescue Puma::HttpParserError => e
        raise RequestRefused.new(limit_status(e.message), e.message)
      end

      # Puma's parser names the element that was too long: the request target (414) or a header (431).
      def limit_status(message)
        case message
        when /REQUEST_(URI|PATH)|QUERY_STRING|FRAGMENT/ then 414
        when /FIELD_|HEADER/ then (message.include?("longer than") ? 431 : 400)
        else 400
        end
      end

      # RFC 9112 6: chunked (the only transfer coding we take: others are 501), else Content-Length.
      def framing
        coding = @env["HTTP_TRANSFER_ENCODING"]
        length = @env["CONTENT_LENGTH"]
        if coding
          raise RequestRefused.new(501, "transfer coding #{coding.inspect} is not supported") unless coding.strip.casecmp("chunked") == 0
          raise RequestRefused.new(400, "both Transfer-Encoding and Content-Length") if length
          @chunked = true
          @decoded = +"".b
          @scan = @head_size
          return
        end
        return if length.nil?
        raise RequestRefused.new(400, "bad Content-Length #{length.inspect}") unless length.match?(LENGTH)
        @length = length.to_i
        raise RequestRefused.new(413, "the body is larger than #{@max_body} bytes") if @length > @max_body
      end

      def fixed_body
        finish = @head_size + @length
        return nil if @buffer.bytesize < finish
        body = (@length == 0) ? +"".b : @buffer.byteslice(@head_size, @length)
        consume(finish)
        body
      end

      # Decodes chunks as they complete; nil until the last chunk and the trailer section are in.
      def chunked_body
        loop do
          line_end = @buffer.index(CRLF, @scan) or return too_long_line(@buffer.bytesize - @scan)
          line = @buffer.byteslice(@scan, line_end - @scan)
          size_text = line.split(";", 2).first.to_s.strip
          raise RequestRefused.new(400, "bad chunk size #{line[0, 40].inspect}") unless size_text.match?(CHUNK_SIZE)
          size = size_text.to_i(16)
          raise RequestRefused.new(413, "the body is larger than #{@max_body} bytes") if @decoded.bytesize + size > @max_body
          return trailers(line_end + 2) if size == 0
          data_end = line_end + 2 + size
          return nil if @buffer.bytesize < data_end + 2
          raise RequestRefused.new(400, "a chunk is longer than its size") unless @buffer.byteslice(data_end, 2) == CRLF
          @decoded << @buffer.byteslice(line_end + 2, size)
          @scan = data_end + 2
        end
      end

      # After the last chunk: trailer lines (ignored) up to an empty line.
      def trailers(from)
        at = from
        loop do
          line_end = @buffer.index(CRLF, at) or return too_long_line(@buffer.bytesize - at)
          if line_end == at
            body = @decoded
            consume(at + 2)
            return body
          end
          at = line_end + 2
          raise RequestRefused.new(431, "trailers too long") if at - from > 8192
        end
      end

      def too_long_line(size)
        raise RequestRefused.new(400, "a chunk line is too long") if size > 1024
        nil
      end

      # Drops one request's bytes; a pipelined next request stays.
      def consume(size)
        @buffer = (size >= @buffer.bytesize) ? +"".b : @buffer.byteslice(size, @buffer.bytesize - size)
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
