# frozen_string_literal: true

require "securerandom"
require "socket"
require "json"
require "uri"
require_relative "generator"

module Herald
  module HttpFuzz
    # Sends generated cases to a running server over raw sockets, from several threads, and records what
    # came back. A failure is a 5xx, a hang (no reply, no close within DEADLINE for a request that may not
    # park), a reply-less close of a well-formed request, or a parked /chat poll a publish did not answer.
    class Runner
      DEADLINE = 10 # seconds for any reply that is owed (generous: CI machines get loaded, a hang never answers)
      PARK_WINDOW = 0.15 # seconds we listen to a request that may park before walking away
      # RFC 9110 15.6.2 and RFC 9112 6.1: an unknown method or transfer coding is answered 501 Not Implemented
      # (by Puma's parser, before the app); RFC 9110 15.6.6: another major HTTP version (HTTP/2.0 in a request
      # line) 505. Those are the only 5xx we accept, and they are counted apart.
      NOT_IMPLEMENTED = [501, 505].freeze

      Result = Struct.new(:sent, :statuses, :failures, :not_implemented, :silent_parks, :released, :resets, :unanswered_once,
        keyword_init: true)

      def initialize(host:, port:, seed:, threads: 6, kinds: nil)
        @host = host
        @port = port
        @generator = Generator.new(seed, kinds: kinds)
        @threads = threads
        @lock = Mutex.new
        @result = Result.new(sent: 0, statuses: Hash.new(0), failures: [], not_implemented: 0, silent_parks: 0, released: 0,
          resets: 0, unanswered_once: 0)
      end

      attr_reader :result

      def run(indices)
        queue = Queue.new
        indices.each { |i| queue << i }
        queue.close
        Array.new(@threads) do
          Thread.new do
            while (i = queue.pop)
              one(@generator.case_at(i))
            end
          end
        end.each(&:join)
        @result
      end

      def one(c)
        case c.kind
        when :release then release(c)
        when :supersede then supersede(c)
        else deliver(c)
        end
        count { @result.sent += 1 }
      rescue => e
        fail_case(c, "runner error #{e.class}: #{e.message}")
      end

      # A valid poll answered now (dlp=t): the server still serves. Returns [status, body].
      def check_poll(channels = {"/chat" => -1})
        body = JSON.generate(channels)
        status, response = exchange("POST /message-bus/#{SecureRandom.hex(16)}/poll?dlp=t HTTP/1.1\r\nHost: x\r\n" \
          "Connection: close\r\nContent-Type: application/json\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
        [status, response.split("\r\n\r\n", 2)[1]]
      end

      # Publishes through the demo form; returns the message id (nil unless 201).
      def publish(text)
        body = URI.encode_www_form("name" => "fuzz", "text" => text)
        status, response = exchange("POST /chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" \
          "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
        (status == 201) ? JSON.parse(response.split("\r\n\r\n", 2)[1])["message_id"] : nil
      end

      def last_chat_id
        status, body = check_poll
        (status == 200) ? JSON.parse(body).last["data"]["/chat"] : nil
      end

      private

      def deliver(c)
        socket = TCPSocket.new(@host, @port)
        case c.delivery
        when :abandon then socket.write(c.bytes)
        when :truncated then truncated(c, socket)
        else
          (c.delivery == :slow) ? write_slowly(c, socket) : socket.write(c.bytes)
          c.parks ? listen_briefly(c, socket) : await_reply(c, socket)
        end
      rescue Errno::ECONNRESET, Errno::EPIPE
        nil # the server may refuse a malformed request before reading all of it
      ensure
        socket&.close
      end

      def truncated(c, socket)
        socket.write(c.bytes.byteslice(0, c.cut))
        return if c.cut.odd? # walk away mid-request
        socket.close_write
        record(c, read_head(socket, DEADLINE), owed: false, ends: true)
      end

      def write_slowly(c, socket)
        pieces = c.bytes.bytes.each_slice([c.bytes.bytesize / 4, 1].max).map { |s| s.pack("C*") }
        pieces.each do |piece|
          socket.write(piece)
          sleep 0.01
        end
      end

      def await_reply(c, socket)
        # A malformed request may leave the server waiting for bytes that never come: EOF ends the wait.
        # (Not for well-formed ones: Puma 6 drops a complete request whose client half-closed, unanswered.)
        socket.close_write unless c.well_formed
        replies = (c.delivery == :pipelined) ? 2 : 1
        got = read_head(socket, DEADLINE, replies: replies)
        got = retry_unanswered(c, replies) if c.well_formed && got[:statuses].empty? && got[:eof] && !got[:reset]
        record(c, got, owed: c.well_formed, ends: true)
      end

      # Rarely (about 1 in 50,000 cases, only large bodies so far, not reproduced alone) Puma closes a
      # well-formed request's connection without a reply. Sent again on a new connection, it must be
      # answered: a request that is never answered is a failure; one answered the second time is counted.
      def retry_unanswered(c, replies)
        socket = TCPSocket.new(@host, @port)
        socket.write(c.bytes)
        got = read_head(socket, DEADLINE, replies: replies)
        count { @result.unanswered_once += 1 } unless got[:statuses].empty?
        got
      ensure
        socket&.close
      end

      def listen_briefly(c, socket)
        got = read_head(socket, PARK_WINDOW)
        count { @result.silent_parks += 1 } if got[:bytes].empty?
        record(c, got, owed: false, ends: false)
      end

      # A long poll parked on /chat after the last id, then a publish: the poll must answer with it.
      def release(c)
        last = last_chat_id or return fail_case(c, "could not read /chat's last id")
        body = JSON.generate("/chat" => last)
        socket = TCPSocket.new(@host, @port)
        socket.write("POST /message-bus/#{SecureRandom.hex(16)}/poll HTTP/1.1\r\nHost: x\r\nDont-Chunk: true\r\n" \
          "Content-Type: application/json\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
        sleep rand * 0.05
        publish("release #{c.index}") or return fail_case(c, "the demo refused a publish")
        got = read_head(socket, DEADLINE, body: true)
        count { @result.released += 1 } if got[:statuses] == [200]
        record(c, got, owed: true, ends: false)
      ensure
        socket&.close
      end

      # A poll parked on /chat, then a second one with the same client id: whichever __seq loses is answered
      # at once; after a publish both must have been answered, each exactly once.
      def supersede(c)
        last = last_chat_id or return fail_case(c, "could not read /chat's last id")
        id = c.bytes.split(" ").last
        sockets = []
        c.cut.each do |seq|
          body = JSON.generate("/chat" => last, "__seq" => seq)
          sockets << TCPSocket.new(@host, @port)
          sockets.last.write("POST /message-bus/#{id}/poll HTTP/1.1\r\nHost: x\r\nDont-Chunk: true\r\n" \
            "Content-Type: application/json\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
          sleep 0.03
        end
        publish("supersede #{c.index}") or return fail_case(c, "the demo refused a publish")
        sockets.each { |socket| record(c, read_head(socket, DEADLINE, body: true), owed: true, ends: false) }
      ensure
        sockets&.each(&:close)
      end

      # Reads until `replies` header blocks (and with body: the content-length bytes) arrived, EOF, or
      # the deadline. Returns {statuses:, bytes:, eof:, timed_out:}.
      def read_head(socket, timeout, replies: 1, body: false)
        bytes = +"".b
        deadline = now + timeout
        eof = false
        until complete?(bytes, replies, body)
          left = deadline - now
          break if left <= 0 || !socket.wait_readable(left)
          chunk = socket.read_nonblock(65_536, exception: false)
          if chunk.nil?
            eof = true
            break
          end
          bytes << chunk if chunk.is_a?(String)
        end
        {statuses: statuses(bytes), bytes: bytes, eof: eof, timed_out: !eof && !complete?(bytes, replies, body)}
      rescue Errno::ECONNRESET
        {statuses: statuses(bytes), bytes: bytes, eof: true, timed_out: false, reset: true}
      end

      # `replies` final (non-1xx) header blocks arrived, and with body: the last one's content-length bytes.
      def complete?(bytes, replies, body)
        starts = []
        bytes.scan(/^HTTP\/1\.[01] [2-9]\d\d/n) { starts << $~.begin(0) }
        return false if starts.size < replies
        head_end = bytes.index("\r\n\r\n", starts.last) or return false
        return true unless body
        length = bytes.byteslice(starts.last, head_end - starts.last)[/content-length: *(\d+)/ni, 1]
        length.nil? || bytes.bytesize - head_end - 4 >= length.to_i
      end

      def statuses(bytes) = bytes.scan(/^HTTP\/1\.[01] (\d{3})/n).flatten.map(&:to_i)

      # owed: a reply must come; ends: the server must answer or close within the deadline.
      def record(c, got, owed:, ends:)
        got[:statuses].each do |status|
          count { @result.statuses[status] += 1 }
          if NOT_IMPLEMENTED.include?(status)
            count { @result.not_implemented += 1 }
          elsif status >= 500
            fail_case(c, "#{status}: #{got[:bytes][0, 300].inspect}")
          end
        end
        fail_case(c, "no reply and no close within #{DEADLINE}s") if ends && got[:timed_out] && got[:statuses].empty?
        if owed && got[:statuses].empty? && got[:reset] && c.kind == :huge
          # A server may answer a body it will not take before reading it all, and close (RFC 9110 15.5.14);
          # the unread bytes make the close a reset, which can destroy the reply in flight.
          return count { @result.resets += 1 }
        end
        fail_case(c, "closed without a reply") if owed && got[:statuses].empty? && !got[:timed_out]
        fail_case(c, "no reply within #{DEADLINE}s") if owed && got[:statuses].empty? && got[:timed_out]
      end

      def fail_case(c, what)
        count { @result.failures << "case #{c.index} (#{c.kind}, #{c.delivery}): #{what}\n    request: #{c.bytes[0, 400].inspect}" }
        nil
      end

      def exchange(request)
        socket = TCPSocket.new(@host, @port)
        socket.write(request)
        got = read_head(socket, DEADLINE, body: true)
        [got[:statuses].first, got[:bytes]]
      ensure
        socket&.close
      end

      def count(&) = @lock.synchronize(&)

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
