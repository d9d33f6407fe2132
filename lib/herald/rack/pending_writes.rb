# frozen_string_literal: true

module Herald
  module Rack
    # Bytes for a non-blocking socket, shared by parked clients (SocketConnection) and `herald server`'s
    # HTTP connections: written at once while nothing waits, else queued in order and drained when the
    # socket turns writable. Uses the includer's @io, @pending (an Array of strings not yet taken by the
    # kernel; nil when nothing waits) and @pending_bytes. IOError and SystemCallError are the includer's.
    module PendingWrites
      private

      # True when the kernel took all of `bytes` now; false when they wait (behind others, or partly written).
      def write_or_queue(bytes)
        if @pending
          @pending << bytes
          @pending_bytes += bytes.bytesize
          return false
        end
        written = @io.write_nonblock(bytes, exception: false)
        return true if written == bytes.bytesize
        rest = written.is_a?(Integer) ? bytes.byteslice(written, bytes.bytesize - written) : bytes
        @pending = [rest]
        @pending_bytes = rest.bytesize
        false
      end

      # Hands the kernel what it takes, yielding after every write that moved bytes. True when all is out.
      def drain
        while (bytes = @pending&.first)
          written = @io.write_nonblock(bytes, exception: false)
          return false unless written.is_a?(Integer)
          yield
          @pending_bytes -= written
          if written == bytes.bytesize
            @pending.shift
          else
            @pending[0] = bytes.byteslice(written, bytes.bytesize - written)
            return false
          end
        end
        @pending = nil
        true
      end
    end
  end
end
