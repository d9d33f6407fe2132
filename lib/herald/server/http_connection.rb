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
    #
    # Framing follows RFC 9112 strictly, since a proxy in front may read a lenient case differently
    # (request smuggling): the HTTP version, Host, Transfer-Encoding and Content-Length, chunk lines and
    # trailers are checked to the grammar, and anything else is a 400 (505 for another major version).
    # Puma's parser already refuses bad request lines and field lines (bare CR or LF, obs-fold, whitespace
    # before a colon, NUL).
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
      OWS = /\A[ \t]+|[ \t]+\z/
      TOKEN = '[!#$%&\'*+\-.^_`|~0-9A-Za-z]+'
      QUOTED = '"(?:[\\t \\x21\\x23-\\x5B\\x5D-\\x7E\\x80-\\xFF]|\\\\[\\t \\x21-\\x7E\\x80-\\xFF])*"'
      # RFC 9112 7.1 and 7.1.1: chunk-size [ chunk-ext ], chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS
      # ( token / quoted-string ) ] ). No whitespace before the size or after it unless an extension
      # follows, no bare CR or LF. Fifteen hex digits at most (a size that fits in a Ruby Integer cheaply).
      CHUNK_LINE = /\A(\h{1,15})(?:[ \t]*;[ \t]*#{TOKEN}(?:[ \t]*=[ \t]*(?:#{TOKEN}|#{QUOTED}))?)*\z/n
      # RFC 9112 7.1.2 and 5: a trailer field is a field line: name ":" OWS value OWS, no CR, LF or NUL.
      FIELD_LINE = /\A#{TOKEN}:[\t\x20-\x7E\x80-\xFF]*\z/n
      # RFC 9112 2.3: HTTP-version = "HTTP/" DIGIT "." DIGIT.
      VERSION = %r{\AHTTP/(\d)\.(\d)\z}
      # RFC 9110 7.2: Host = uri-host [ ":" port ] (RFC 3986: IP-literal, IPv4address or reg-name). Puma's
      # parser joins repeated fields with ", ", which this refuses too (RFC 9112 3.2: more than one Host).
      # One invalid form is taken: an IPv6 address without brackets, port appended, as Ruby 3.1's Net::HTTP
      # (net-http 0.2) sends for http://[::1]:9292/ (it cannot hide a second request: hex digits and colons).
      HOST = /\A(?:(?:\[[0-9A-Za-z:._~!$&'()*+,;=-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::\d*)?|\h*:\h*:[\h:.]*)\z/

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

      # HTTP/1.1 100 Continue, once, to a client that waits for it before it sends its body (RFC 9110
      # 10.1.1: an HTTP/1.0 client's expectation is ignored).
      def continue?
        return false if @continued || !@head || !@http11 || @env["HTTP_EXPECT"].to_s.casecmp("100-continue") != 0
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
        @http11 = false
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

      # RFC 9112 6: chunked (the only transfer coding we take), else Content-Length, else no body.
      def framing
        version!
        host!
        coding = @env["HTTP_TRANSFER_ENCODING"]
        length = @env["CONTENT_LENGTH"]
        return chunked!(coding, length) if coding
        return if length.nil?
        length = length.gsub(OWS, "")
        raise RequestRefused.new(400, "bad Content-Length #{length.inspect}") unless length.match?(LENGTH)
        @length = length.to_i
        raise RequestRefused.new(413, "the body is larger than #{@max_body} bytes") if @length > @max_body
      end

      # RFC 9112 2.3 and RFC 9110 2.5, 15.6.6: HTTP/1.x is served (1.2 and above as 1.1), another major
      # version is answered 505, anything that is not DIGIT "." DIGIT is a 400.
      def version!
        version = @env["SERVER_PROTOCOL"].to_s
        major, minor = VERSION.match(version)&.captures
        raise RequestRefused.new(400, "bad HTTP version #{version[0, 20].inspect}") unless major
        raise RequestRefused.new(505, "HTTP/#{major}.#{minor} is not supported, only HTTP/1.x") unless major == "1"
        @http11 = minor != "0"
        @env["SERVER_PROTOCOL"] = "HTTP/1.1" if minor > "1"
      end

      # RFC 9112 3.2: an HTTP/1.1 request without Host, and any request with more than one or with an invalid
      # one, is a 400.
      def host!
        host = @env["HTTP_HOST"]
        if host.nil?
          raise RequestRefused.new(400, "an HTTP/1.1 request without Host") if @http11
          return
        end
        host = @env["HTTP_HOST"] = host.gsub(OWS, "")
        raise RequestRefused.new(400, "bad Host #{host[0, 80].inspect}") unless host.match?(HOST)
      end

      # RFC 9112 6.1: Transfer-Encoding in HTTP/1.0 is faulty framing, and chunked is applied at most once;
      # 6.3: chunked must be the final coding, Content-Length beside it is an error (both 400, then close);
      # 6.1: an unknown coding before chunked is 501 Not Implemented.
      def chunked!(coding, length)
        raise RequestRefused.new(400, "Transfer-Encoding in an HTTP/1.0 request") unless @http11
        raise RequestRefused.new(400, "both Transfer-Encoding and Content-Length") if length
        codings = coding.split(",").map { |c| c.gsub(OWS, "").downcase }.reject(&:empty?)
        raise RequestRefused.new(400, "chunked is not the final transfer coding: #{coding[0, 80].inspect}") unless codings.last == "chunked"
        raise RequestRefused.new(400, "chunked applied more than once: #{coding[0, 80].inspect}") if codings.count("chunked") > 1
        raise RequestRefused.new(501, "transfer coding #{coding[0, 80].inspect} is not supported") if codings.size > 1
        @chunked = true
        @decoded = +"".b
        @scan = @head_size
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
          size = CHUNK_LINE.match(line) or raise RequestRefused.new(400, "bad chunk line #{line[0, 40].inspect}")
          size = size[1].to_i(16)
          raise RequestRefused.new(413, "the body is larger than #{@max_body} bytes") if @decoded.bytesize + size > @max_body
          return trailers(line_end + 2) if size == 0
          data_end = line_end + 2 + size
          return nil if @buffer.bytesize < data_end + 2
          raise RequestRefused.new(400, "a chunk is longer than its size") unless @buffer.byteslice(data_end, 2) == CRLF
          @decoded << @buffer.byteslice(line_end + 2, size)
          @scan = data_end + 2
        end
      end

      # After the last chunk: trailer field lines (checked, then ignored) up to an empty line.
      def trailers(from)
        at = from
        loop do
          line_end = @buffer.index(CRLF, at) or return too_long_line(@buffer.bytesize - at)
          if line_end == at
            body = @decoded
            consume(at + 2)
            return body
          end
          line = @buffer.byteslice(at, line_end - at)
          raise RequestRefused.new(400, "bad trailer field #{line[0, 40].inspect}") unless FIELD_LINE.match?(line)
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
