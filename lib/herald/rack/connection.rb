# frozen_string_literal: true

module Herald
  module Rack
    # One parked client: a long poll, a chunked stream or an SSE stream, as the event loop sees it.
    # What is written for each event depends on the mode and the encoding; how the bytes leave depends on
    # the transport (SocketConnection: a hijacked socket we write HTTP to ourselves; QueueConnection: a
    # Rack body the app server drains, which does its own framing). Only the event loop calls these methods.
    class Connection
      MODES = %i[poll chunked sse].freeze
      DELIVER = "deliver.herald"

      attr_reader :client, :mode, :encoding
      attr_accessor :deadline, :indexed

      def initialize(client:, mode:, encoding:, wire:)
        @client = client
        @mode = mode
        @encoding = encoding
        @wire = wire
        @deadline = nil
        @closed = false
      end

      def closed? = @closed

      def streaming? = @mode != :poll

      # Whether the fan-out may hand this client a message's shared reply bytes (SocketConnection).
      def shared_reply? = false

      # Stops the event loop's watching before the (deferred) close: nothing to watch here.
      def unwatch = nil

      # The first bytes: headers and backlog for streams (`[]` when there is none: the JS client gives up
      # on streaming if nothing arrives within 3 s). A long poll with nothing to say writes nothing yet.
      def start(msgs, status)
        Metrics.delivered(@mode, msgs.size) unless msgs.empty? || @mode == :poll # (a poll with messages is answered, never parked)
        case @mode
        when :chunked
          write_head
          if msgs.empty? && status.nil?
            write(empty_chunk)
          else
            write(chunk_body(msgs, status))
          end
        when :sse
          write_head
          write(": herald\nretry: 1000\n\n")
          msgs.each { |m| write(@wire.sse(m)) }
          write("event: status\ndata: #{@wire.status_json(status)}\n\n") if status
        end
      end

      # Messages for this client, already filtered. A long poll replies with them and ends.
      def deliver(msgs)
        write_messages(msgs)
        Metrics.delivered(@mode, msgs.size)
        delivered(msgs.size) if Instrumentation.listening?(DELIVER)
      end

      # deliver.herald, once the bytes are handed over (the reactor's shared-reply fast path calls this too,
      # when somebody listens). Not timed: the writes never block. Never the client (its id is a bearer
      # token). Modes named as poll.herald's.
      def delivered(count)
        Instrumentation.instrument(DELIVER, {mode: (@mode == :poll) ? :long_poll : @mode, encoding: @encoding, messages: count})
      end

      # Timeout or superseded: an empty reply, or `[]` and the end of the stream (docs/protocol.md 1.5, 1.6).
      def finish
        return if @closed
        case @mode
        when :poll then reply([])
        when :chunked
          write(empty_chunk)
          finish_stream
        else finish_stream
        end
      end

      private

      def write_messages(msgs)
        case @mode
        when :poll then reply(msgs)
        when :chunked then msgs.each { |m| write(message_chunk(m)) }
        when :sse then msgs.each { |m| write(@wire.sse(m)) }
        end
      end

      def json? = @encoding == :json

      def encode(msgs, status = nil) = json? ? @wire.json_array(msgs, status) : @wire.msgpack_array(msgs, status)

      def content_type
        return Middleware::MSGPACK_TYPE unless json?
        case @mode
        when :poll then Middleware::JSON_TYPE
        when :chunked then Middleware::CHUNKED_TYPE
        else Middleware::SSE_TYPE
        end
      end
    end
  end
end
