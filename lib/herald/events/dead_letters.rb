# frozen_string_literal: true

require "set"

module Herald
  module Events
    # Events a deferred subscriber gave up on, kept in the store on `/herald/dead/<Subscriber>` as
    # MessagePack maps (any process can read them without the app's classes): the original message's
    # ids, channel, codec and payload bytes, and the error's class and message. The subscriber's cursor
    # moves past the event; `herald replay` (or DeadLetters#replay) runs the handler again.
    class DeadLetters
      PREFIX = "/herald/dead/"
      # A dead-letter channel keeps the latest 10,000 (message_bus-style retention by count).
      MAX_BACKLOG_SIZE = 10_000

      # One dead letter, as listed by `herald dead`.
      Letter = Struct.new(:id, :subscriber, :global_id, :channel, :error, :error_message, :attempts, :failed_at, :message,
        :backtrace, keyword_init: true)
      BACKTRACE_LINES = 20

      # Which dead letters an operator retried or deleted: MessagePack {"ids" => [...], "action" => ...}
      # records on `/herald/dead-resolved/<Subscriber>` (the store only appends: nothing is rewritten).
      RESOLVED_PREFIX = "/herald/dead-resolved/"
      RESOLVE_BATCH = 1000 # ids per record

      def self.channel(name) = "#{PREFIX}#{name}"

      def self.resolved_channel(name) = "#{RESOLVED_PREFIX}#{name}"

      # Retries asked of the subscriber's worker, wherever it runs (the dashboard's process may not load the
      # subscriber's class): MessagePack {"ids" => [...]} records; the worker holding the lease serves them.
      REQUEST_PREFIX = "/herald/dead-retry/"

      def self.request_channel(name) = "#{REQUEST_PREFIX}#{name}"

      def request_retry(name, ids)
        ids.each_slice(RESOLVE_BATCH) do |slice|
          @store.append(self.class.request_channel(name), Codec::Msgpack.encode({"ids" => slice}), codec: Codec::Msgpack,
            max_backlog_size: MAX_BACKLOG_SIZE)
        end
      end

      # Runs the retries asked since request id `after` (see request_retry); returns the last request id
      # served. Letters already resolved are skipped, so serving a request again runs nothing twice.
      def serve_retry_requests(subscriber, after)
        requests = @store.backlog(self.class.request_channel(subscriber.subscriber_name), after)
        return after if requests.empty?
        retry_letters(subscriber, requests.flat_map { |m| m.data["ids"] })
        requests.last.message_id
      end

      def initialize(store)
        @store = store
      end

      def bury(name, msg, error, attempts)
        data = {"subscriber" => name, "global_id" => msg.global_id, "message_id" => msg.message_id,
                "channel" => msg.channel, "created_at" => msg.created_at, "codec" => msg.codec.id,
                "payload" => msg.payload.b, "error" => error.class.name, "error_message" => Delivery.readable(error.message),
                "attempts" => attempts, "failed_at" => Process.clock_gettime(Process::CLOCK_REALTIME),
                "backtrace" => Array(error.backtrace).first(BACKTRACE_LINES).map { |line| Delivery.readable(line) }}
        @store.append(self.class.channel(name), Codec::Msgpack.encode(data), codec: Codec::Msgpack,
          max_backlog_size: MAX_BACKLOG_SIZE)
      end

      # The global id of the last event `name` gave up on (0: none retained). A subscriber's events are
      # buried in log order, so every event up to it was done with: a cursor behind it (a crash between
      # the burial and the cursor's save) resumes after it, and no event is buried twice.
      # A cursor an operator moved (Store::Controls#mark_reset) is not pushed past the letters buried before.
      def last_buried(name)
        channel = self.class.channel(name)
        last = @store.last_id(channel)
        return 0 if last.zero? || last <= @store.reset_mark(name)
        @store.backlog(channel, last - 1).last&.data&.fetch("global_id", 0) || 0
      end

      # Every dead letter of every subscriber (or of one), oldest first.
      def list(name = nil)
        msgs = name ? @store.backlog(self.class.channel(name), 0) : dead_messages
        msgs.map { |m| letter(m) }
      end

      # The dead letters of `name` nobody retried or deleted yet, oldest first.
      def pending(name)
        done = resolved_ids(name)
        list(name).reject { |l| done.include?(l.id) }
      end

      def resolved_ids(name)
        @store.backlog(self.class.resolved_channel(name), 0).each_with_object(Set.new) { |m, ids| ids.merge(m.data["ids"]) }
      end

      # Marks dead letters as done with (deleted, or retried): they leave `pending`.
      def resolve(name, ids, action)
        ids.each_slice(RESOLVE_BATCH) do |slice|
          @store.append(self.class.resolved_channel(name), Codec::Msgpack.encode({"ids" => slice, "action" => action}),
            codec: Codec::Msgpack, max_backlog_size: MAX_BACKLOG_SIZE)
        end
      end

      # Runs `subscriber`'s handler once on each of its pending dead letters whose id is in `ids`, one
      # process at a time (a lease): each is marked resolved right after its call, so a second retry skips
      # it. One that fails again is buried anew (a new dead letter, one more attempt) and the old one
      # resolved. Returns [[Letter, nil or the error], ...]. Raises BusyError while another process retries.
      def retry_letters(subscriber, ids)
        name = subscriber.subscriber_name
        lease = @store.lease("herald.retry:#{name}") or
          raise BusyError, "another process is retrying #{name}'s dead letters: try again once it is done"
        begin
          wanted = ids.to_set
          handler = subscriber.new
          pending(name).select { |l| wanted.include?(l.id) }.map do |letter|
            error = run(subscriber, handler, letter.message)
            bury(name, letter.message, error, letter.attempts + 1) if error
            resolve(name, [letter.id], error ? "failed again" : "retried")
            [letter, error]
          end
        ensure
          lease.release
        end
      end

      # Runs `subscriber`'s handler once on each of its dead letters with id >= from. Returns
      # [[Letter, nil or the error it raised again], ...]; failures stay in the dead-letter channel.
      def replay(subscriber, from: 1)
        handler = subscriber.new
        @store.backlog(self.class.channel(subscriber.subscriber_name), from - 1).map do |m|
          letter = letter(m)
          original = letter.message
          [letter, run(subscriber, handler, original)]
        end
      end

      # A stored dead-letter message as a Letter (its original message rebuilt).
      def letter(m)
        d = m.data
        codec = Codec.fetch(d["codec"])
        original = Message.new(global_id: d["global_id"], message_id: d["message_id"], channel: d["channel"],
          payload: payload(d["payload"], codec), codec: codec, created_at: d["created_at"])
        Letter.new(id: m.message_id, subscriber: d["subscriber"], global_id: d["global_id"], channel: d["channel"],
          error: d["error"], error_message: d["error_message"], attempts: d["attempts"], failed_at: d["failed_at"],
          message: original, backtrace: d["backtrace"])
      end

      private

      def dead_messages
        @store.global_backlog(0).select { |m| m.channel.start_with?(PREFIX) }
      end

      # The payload as every store returns it: JSON text is UTF-8, other codecs' bytes binary.
      def payload(bytes, codec)
        codec.equal?(Codec::Json) ? bytes.dup.force_encoding(Encoding::UTF_8).freeze : bytes.b.freeze
      end

      def run(subscriber, handler, original)
        payload = {subscriber: subscriber.subscriber_name, event: nil, message: original, attempt: 1, deferred: true, replay: true}
        Instrumentation.instrument(Delivery::PROCESS, payload) do
          payload[:event] = original.data
          handler.call(payload[:event], original)
        end
        nil
      rescue => e
        e
      end
    end
  end
end
