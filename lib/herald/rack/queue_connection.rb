# frozen_string_literal: true

module Herald
  module Rack
    # A parked client whose bytes leave through a Rack response body that the app server drains: a Rack 3
    # streaming body (`call(stream)`) under Falcon, where waiting on the queue parks only a fiber, or an
    # enumerable body (`each`) elsewhere (Rack::MockRequest, servers without hijack), where it holds that
    # server thread. The server does the HTTP framing, so we hand it unframed segments.
    #
    # The event loop only pushes onto a queue, so it never blocks; a reader more than `max_queue` writes
    # behind is dropped.
    class QueueConnection < Connection
      CLOSE = :close

      attr_reader :queue

      def initialize(max_queue:, on_gone:, **options)
        super(**options)
        @queue = Thread::Queue.new
        @max_queue = max_queue
        @on_gone = on_gone
      end

      def write(bytes)
        return if @closed
        @queue << bytes
        drop if @queue.size > @max_queue
      end

      def pending? = false

      def drop
        return if @closed
        @closed = true
        @queue.clear
        @queue << CLOSE
      end

      # The Rack body, for the app server. Its `close` tells the event loop the client is gone.
      def rack_body(streaming:)
        streaming ? StreamBody.new(self) : EachBody.new(self)
      end

      def gone
        @on_gone.call(self) unless @closed
      end

      # Blocks (a thread, or a fiber under a fiber scheduler) until the next bytes or the end.
      module Draining
        def initialize(connection)
          @connection = connection
        end

        def each
          queue = @connection.queue
          while (bytes = queue.pop) != CLOSE
            yield bytes
          end
        end

        def close = @connection.gone
      end

      class EachBody
        include Draining
      end

      class StreamBody
        include Draining

        def call(stream)
          each { |bytes| stream.write(bytes) }
        rescue IOError, SystemCallError
          nil
        ensure
          close
          stream.close
        end
      end

      private

      def write_head = nil

      def finish_stream
        @closed = true
        @queue << CLOSE
      end

      def reply(msgs)
        write(encode(msgs))
        finish_stream
      end

      def empty_chunk = json? ? Wire::EMPTY_SEGMENT : Wire::MSGPACK_EMPTY_ARRAY

      def chunk_body(msgs, status) = json? ? Wire.segment(encode(msgs, status)) : encode(msgs, status)

      def message_chunk(msg) = json? ? @wire.segment(msg) : @wire.msgpack_chunk(msg, framed: false)
    end
  end
end
