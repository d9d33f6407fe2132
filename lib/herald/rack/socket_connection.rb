# frozen_string_literal: true

module Herald
  module Rack
    # A parked client on a fully hijacked socket (Puma): we write the HTTP response ourselves, with
    # non-blocking writes. What the kernel does not take is kept in a bounded per-client buffer and flushed
    # when the socket turns writable; a client whose buffer passes `max_buffer` bytes, or that has not taken
    # a byte for `write_timeout` seconds, is dropped, so one stalled reader never slows the others.
    class SocketConnection < Connection
      include PendingWrites

      attr_accessor :monitor
      attr_reader :io, :stalled_since, :extra_headers

      def initialize(io:, extra_headers:, max_buffer:, **options)
        super(**options)
        @io = io
        @extra_headers = extra_headers # preformatted "name: value\r\n" lines, or ""
        @max_buffer = max_buffer
        @pending = nil # Array of strings not yet taken by the kernel; nil when all was written
        @pending_bytes = 0
        @stalled_since = nil
        @closing = false
        @want_write = nil # set by the reactor: called when the socket must be watched for writability
      end

      def on_want_write(&block)
        @want_write = block
      end

      def pending? = !@pending.nil?

      # A JSON long poll that has written nothing: its reply can be a message's shared bytes (#write_reply).
      def shared_reply? = @mode == :poll && @encoding == :json && !@closed && @pending.nil?

      # The fan-out's fast path, for a connection that is #shared_reply?: the whole reply (Wire#poll_reply for
      # this client's extra headers) now. True when the kernel took all of it: the connection is closed then and
      # its socket left open for the event loop to close (#release) after the fan-out, with the others, without
      # a callback per client. False when the rest waits for the socket to turn writable (closed once it is
      # out: #flush) or the write failed (dropped: #on_close).
      def write_reply(bytes)
        if write_or_queue(bytes)
          @closed = true
          return true
        end
        @closing = true
        @stalled_since = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @want_write&.call(self)
        false
      rescue IOError, SystemCallError
        drop
        false
      end

      # Bytes for the client; never blocks.
      def write(bytes)
        return if @closed
        queued = !@pending.nil?
        return if write_or_queue(bytes)
        return drop if queued && @pending_bytes > @max_buffer
        return if queued
        @stalled_since = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @want_write&.call(self)
      rescue IOError, SystemCallError
        drop
      end

      # The socket is writable: hand the kernel what it takes. Returns true when everything was written.
      def flush
        return false unless drain { @stalled_since = Process.clock_gettime(Process::CLOCK_MONOTONIC) }
        @stalled_since = nil
        drop if @closing
        true
      rescue IOError, SystemCallError
        drop
        true
      end

      # The client sent something after its request (nothing is expected) or hung up.
      def on_readable
        data = @io.read_nonblock(1024, exception: false)
        drop if data.nil?
      rescue IOError, SystemCallError
        drop
      end

      # Closes, unsent bytes or not. The event loop defers the close itself (see #on_close).
      def drop
        return if @closed
        @closed = true
        @pending = nil
        @on_close ? @on_close.call(self) : release
      end

      # Set by the event loop: it releases closed sockets after a whole fan-out, because closing a thousand
      # sockets costs as much as writing to them and every reader already has its bytes.
      def on_close(&block)
        @on_close = block
      end

      # The event loop stops watching the socket (it may be closed later: Reactor#close_delay); a client hanging
      # up meanwhile is then not reported on every turn.
      def unwatch = @monitor&.close

      def release
        @monitor&.close
        @io.close
      rescue IOError, SystemCallError
        nil
      end

      private

      # Closes once the last byte is out.
      def finish_stream
        write(Wire::TERMINATOR) if @mode == :chunked
        @closing = true
        drop unless @pending
      end

      def write_head
        write(head(content_type, chunked: @mode == :chunked))
      end

      def reply(msgs, status = nil)
        if msgs.size == 1 && status.nil? && json?
          write(@wire.poll_reply(msgs.first, @extra_headers)) # the common case: the same bytes for every reader
        else
          payload = encode(msgs, status)
          write(head(content_type, length: payload.bytesize) << payload)
        end
        finish_stream
      end

      def empty_chunk = json? ? Wire::EMPTY_CHUNK : Wire.frame(Wire::MSGPACK_EMPTY_ARRAY)

      def chunk_body(msgs, status)
        json? ? Wire.frame(Wire.segment(encode(msgs, status))) : Wire.frame(encode(msgs, status))
      end

      def message_chunk(msg) = json? ? @wire.chunk(msg) : @wire.msgpack_chunk(msg)

      # message_bus's hijacked reply (docs/protocol.md 1.4, 1.5): its header order, `connection: close`.
      def head(type, chunked: false, length: nil)
        out = +Wire::HEAD
        out << @extra_headers << "connection: close\r\ncontent-type: " << type << "\r\n"
        if chunked
          out << "transfer-encoding: chunked\r\nx-content-type-options: nosniff\r\n"
        elsif length
          out << "content-length: " << length.to_s << "\r\n"
        elsif @mode == :sse
          out << "x-accel-buffering: no\r\n"
        end
        out << "\r\n"
      end
    end
  end
end
