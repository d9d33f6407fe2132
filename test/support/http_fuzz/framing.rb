# frozen_string_literal: true

module Herald
  module HttpFuzz
    # RFC 9112 request framing, case by case, for `herald server`'s own front end: what a strict server
    # answers. A proxy in front that reads a lenient case differently (a bare LF as a line end, whitespace
    # in a chunk size, a second chunked) would see other requests than the server does: request smuggling.
    #
    # Every case is sent with a second request pipelined behind it (SMUGGLED, a 404): a request served
    # must be followed by exactly that 404 (its body was framed to the byte), a refused one by nothing (the
    # connection closes after the refusal, so nothing hidden in its bytes is ever served).
    module Framing
      Case = Struct.new(:name, :bytes, :replies, keyword_init: true) do
        def refused? = replies.first >= 400
      end

      SMUGGLED = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
      FORM = "Content-Type: application/x-www-form-urlencoded\r\n"
      BODY = "text=hi" # 7 bytes: the demo publishes it (201)

      def self.post(fields = "", body = BODY, version: "HTTP/1.1", host: "Host: x\r\n", target: "/chat")
        "POST #{target} #{version}\r\n#{host}#{FORM}#{fields}\r\n#{body}".b
      end

      def self.sized(**options) = post("Content-Length: #{BODY.bytesize}\r\n", **options)

      def self.chunked(chunks, coding: "chunked", **options) = post("Transfer-Encoding: #{coding}\r\n", chunks, **options)

      def self.c(name, bytes, *replies) = Case.new(name: name, bytes: bytes.b, replies: replies)

      OK = [201, 404].freeze

      CASES = [
        # Served: the grammar allows them.
        c("RFC 9112 6.2: Content-Length", sized, *OK),
        c("RFC 9112 7.1: chunked", chunked("3\r\ntex\r\n4\r\nt=hi\r\n0\r\n\r\n"), *OK),
        c("RFC 9112 7.1: chunk sizes with leading zeros", chunked("0007\r\ntext=hi\r\n000\r\n\r\n"), *OK),
        c("RFC 9112 7.1.1: chunk extensions (token, quoted-string with an escaped quote, BWS around ';' and '=')",
          chunked("7 ;a=b; c = \"x;\\\"y\"\r\ntext=hi\r\n0;last\r\n\r\n"), *OK),
        c("RFC 9112 7.1.2: trailer fields", chunked("7\r\ntext=hi\r\n0\r\nX-Sum: 1\r\nX-Empty:\r\n\r\n"), *OK),
        c("RFC 9112 6.1: transfer codings are case-insensitive", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: "Chunked"), *OK),
        c("RFC 9110 5.6.1: empty list elements in Transfer-Encoding", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: ", chunked"), *OK),
        c("RFC 9112 6.2: Content-Length with OWS (a tab)", post("Content-Length:\t7\r\n"), *OK),
        c("RFC 9110 2.5: HTTP/1.2 is served as HTTP/1.1", sized(version: "HTTP/1.2"), *OK),
        c("RFC 9112 3.2: an HTTP/1.0 request needs no Host (and closes)", sized(version: "HTTP/1.0", host: ""), 201),
        c("RFC 9112 3.2: an empty Host", sized(host: "Host:\r\n"), *OK),
        c("RFC 9110 7.2: Host with an IPv6 literal and a port", sized(host: "Host: [::1]:9292\r\n"), *OK),
        c("RFC 9112 3.2.2: absolute-form, Host ignored", sized(target: "http://example.org/chat", host: "Host: other\r\n"), *OK),

        # Chunk lines (RFC 9112 7.1, 7.1.1): 400 and close.
        c("RFC 9112 7.1.1: a bare LF inside a chunk extension", chunked("7;a=b\nc\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.1: a bare CR inside a chunk extension", chunked("7;a=b\rc\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: a chunk line ended by a bare LF", chunked("7\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: the last chunk ended by a bare LF", chunked("7\r\ntext=hi\r\n0\n\r\n\r\n"), 400),
        c("RFC 9112 7.1: whitespace before the chunk size", chunked(" 7\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: whitespace after the chunk size (BWS only before ';')", chunked("7 \r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: a tab after the chunk size", chunked("7\t\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: whitespace after the last chunk's size", chunked("7\r\ntext=hi\r\n0 \r\n\r\n"), 400),
        c("RFC 9112 7.1: a chunk size with 0x", chunked("0x7\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: a signed chunk size", chunked("+7\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: an empty chunk size", chunked(";a=b\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.1: an extension without a name", chunked("7;\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.1: an extension value with a space", chunked("7;a=b c\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.1: an unterminated quoted-string", chunked("7;a=\"b\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.1: a NUL in an extension", chunked("7;a=\0\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: chunk data longer than its size", chunked("3\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1: chunk data ended by a bare LF", chunked("7\r\ntext=hi\n0\r\n\r\n"), 400),
        c("RFC 9112 7.1.2: a trailer line with a bare LF", chunked("7\r\ntext=hi\r\n0\r\nX: a\nY: b\r\n\r\n"), 400),
        c("RFC 9112 7.1.2: a trailer line that is not a field line", chunked("7\r\ntext=hi\r\n0\r\nnot a field\r\n\r\n"), 400),
        c("RFC 9112 5.2: obs-fold in the trailers", chunked("7\r\ntext=hi\r\n0\r\nX: a\r\n b\r\n\r\n"), 400),
        c("RFC 9112 5.1: whitespace before a trailer's colon", chunked("7\r\ntext=hi\r\n0\r\nX : a\r\n\r\n"), 400),

        # Transfer-Encoding and Content-Length (RFC 9112 6.1, 6.3).
        c("RFC 9112 6.1: chunked applied twice", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: "chunked, chunked"), 400),
        c("RFC 9112 6.1: chunked twice in two field lines",
          post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "7\r\ntext=hi\r\n0\r\n\r\n"), 400),
        c("RFC 9112 6.3: chunked not the final coding", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: "chunked, gzip"), 400),
        c("RFC 9112 6.3: an unknown coding alone (chunked not final)", chunked("text=hi", coding: "gzip"), 400),
        c("RFC 9112 6.3: identity (not a transfer coding since RFC 7230)", chunked("text=hi", coding: "identity"), 400),
        c("RFC 9112 6.3: chunked with a parameter", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: "chunked;q=1"), 400),
        c("RFC 9112 6.1: an unknown coding before chunked is 501", chunked("7\r\ntext=hi\r\n0\r\n\r\n", coding: "gzip, chunked"), 501),
        c("RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 request", chunked("7\r\ntext=hi\r\n0\r\n\r\n", version: "HTTP/1.0"), 400),
        c("RFC 9112 6.1: Transfer-Encoding and Content-Length in an HTTP/1.0 request",
          post("Transfer-Encoding: chunked\r\nContent-Length: 7\r\n", version: "HTTP/1.0"), 400),
        c("RFC 9112 6.3: Transfer-Encoding and Content-Length", post("Content-Length: 7\r\nTransfer-Encoding: chunked\r\n"), 400),
        c("RFC 9112 6.3: two different Content-Lengths", post("Content-Length: 7\r\nContent-Length: 8\r\n"), 400),
        c("RFC 9112 6.3: two equal Content-Lengths", post("Content-Length: 7\r\nContent-Length: 7\r\n"), 400),
        c("RFC 9112 6.3: a Content-Length with a sign", post("Content-Length: +7\r\n"), 400),
        c("RFC 9112 6.3: a Content-Length in hex", post("Content-Length: 0x7\r\n"), 400),
        c("RFC 9112 5.1: whitespace between Transfer-Encoding and its colon",
          post("Transfer-Encoding : chunked\r\n", "7\r\ntext=hi\r\n0\r\n\r\n"), 400),

        # Host (RFC 9112 3.2) and the HTTP version (RFC 9112 2.3, RFC 9110 15.6.6).
        c("RFC 9112 3.2: an HTTP/1.1 request without Host", sized(host: ""), 400),
        c("RFC 9112 3.2: two Host field lines", sized(host: "Host: a\r\nHost: b\r\n"), 400),
        c("RFC 9112 3.2: a Host with a space", sized(host: "Host: a b\r\n"), 400),
        c("RFC 9112 3.2: a Host with a path", sized(host: "Host: a/b\r\n"), 400),
        c("RFC 9112 3.2: a Host with userinfo", sized(host: "Host: u@a\r\n"), 400),
        c("RFC 9112 3.2: absolute-form without Host (HTTP/1.1)", sized(target: "http://example.org/chat", host: ""), 400),
        c("RFC 9110 15.6.6: an HTTP/2.0 request line", sized(version: "HTTP/2.0"), 505),
        c("RFC 9110 15.6.6: an HTTP/0.9 request line", sized(version: "HTTP/0.9"), 505),
        c("RFC 9112 2.3: a two-digit minor version", sized(version: "HTTP/1.10"), 400),
        c("RFC 9112 2.3: a two-digit major version", sized(version: "HTTP/11.1"), 400),
        c("RFC 9112 2.3: a lower-case HTTP-name", sized(version: "http/1.1"), 400),

        # Line and field syntax (RFC 9112 2.2, 5; Puma's parser).
        c("RFC 9112 2.2: a bare CR in a field value", post("X: a\rb\r\nContent-Length: 7\r\n"), 400),
        c("RFC 9112 2.2: a header section with bare LF line ends", "POST /chat HTTP/1.1\nHost: x\nContent-Length: 7\n\ntext=hi", 400),
        c("RFC 9112 2.2: whitespace before the first field line", "POST /chat HTTP/1.1\r\n Host: x\r\nContent-Length: 7\r\n\r\ntext=hi", 400),
        c("RFC 9112 5.2: obs-fold in a field", post("X: a\r\n b\r\nContent-Length: 7\r\n"), 400),
        c("RFC 9110 5.5: a NUL in a field value", post("X: a\0b\r\nContent-Length: 7\r\n"), 400)
      ].freeze

      READ_WITHIN = 5 # seconds

      # Sends a case and SMUGGLED behind it (whole, or in random pieces when given a Random); returns what
      # came back: {statuses: [...], closed: true when the server closed the connection}.
      def self.exchange(host, port, c, random: nil)
        socket = TCPSocket.new(host, port)
        send_bytes(socket, c.bytes + SMUGGLED, random)
        read_replies(socket, c)
      ensure
        socket&.close
      end

      def self.send_bytes(socket, bytes, random)
        return socket.write(bytes) unless random
        at = 0
        while at < bytes.bytesize
          size = random.rand(1..8)
          socket.write(bytes.byteslice(at, size))
          at += size
          sleep 0.001
        end
      rescue Errno::EPIPE, Errno::ECONNRESET
        nil # refused before everything was sent: what came back tells
      end

      # Until the server closes, or (a served keep-alive case) the replies expected are complete.
      def self.read_replies(socket, c)
        bytes = +"".b
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READ_WITHIN
        wait_for_close = c.refused? || c.replies.size == 1
        loop do
          return {statuses: statuses(bytes), closed: false} if !wait_for_close && complete?(bytes, c.replies.size)
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return {statuses: statuses(bytes), closed: false, timed_out: true} if left <= 0 || !socket.wait_readable(left)
          chunk = socket.read_nonblock(65_536, exception: false)
          return {statuses: statuses(bytes), closed: true} if chunk.nil?
          bytes << chunk if chunk.is_a?(String)
        end
      rescue Errno::ECONNRESET
        {statuses: statuses(bytes), closed: true, reset: true}
      end

      # The status of each reply, walking them by content-length (replies follow each other without a line break).
      def self.statuses(bytes) = replies(bytes).map(&:first)

      def self.complete?(bytes, count) = replies(bytes).count(&:last) >= count

      # [[status, complete?]] for each reply head in the bytes.
      def self.replies(bytes)
        out = []
        at = 0
        while (head_end = bytes.index("\r\n\r\n", at))
          head = bytes.byteslice(at, head_end - at)
          length = head[/^content-length: *(\d+)/ni, 1].to_i
          at = head_end + 4 + length
          out << [head[/\AHTTP\/1\.[01] (\d{3})/n, 1].to_i, at <= bytes.bytesize]
        end
        out
      end
    end
  end
end
