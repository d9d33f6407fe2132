# frozen_string_literal: true

module Herald
  module Events
    # Calls one deferred subscriber's handler for one message: retries with exponential backoff, then
    # the dead-letter channel. Runs on the subscriber's worker thread, so a backoff holds back that
    # subscriber's later events (order per subscriber is kept) and no other subscriber's. Every failure
    # is logged through Herald.logger: a warning for each attempt retried, an error when it gives up.
    #
    # Whatever a handler raises is its own failure, Exception subclasses included (SystemStackError,
    # NotImplementedError, LoadError, NoMemoryError, an app's own): retried as its retry_on says, then
    # dead-lettered, so it never takes the worker thread (and the other subscribers on it) down. Only
    # STOPS go through: the process is asked to stop, and the worker pool hands over before it does.
    class Delivery
      PROCESS = "process.herald"
      RETRY = "retry.herald"
      DEAD = "dead.herald"
      # What a handler may raise that stops the process rather than the event (Interrupt is a SignalException).
      STOPS = [SignalException, SystemExit].freeze

      # controls: the store, where a retry in progress is shown to operators (Store::Controls#mark_retrying).
      def initialize(subscriber, handler, dead_letters:, stopper:, controls: nil)
        @controls = controls
        @subscriber = subscriber
        @name = subscriber.subscriber_name
        @handler = handler
        @policy = subscriber.retry_policy
        @dead_letters = dead_letters
        @stopper = stopper
      end

      # Exceptions carry any bytes (binary, Latin-1, invalid UTF-8); people read them: valid UTF-8 text.
      def self.readable(text)
        text = text.to_s
        text = text.dup.force_encoding(Encoding::UTF_8) if text.encoding == Encoding::BINARY
        text = text.encode(Encoding::UTF_8, invalid: :replace, undef: :replace) unless text.encoding == Encoding::UTF_8
        text.scrub
      end

      # "ArgumentError: message (app/subscribers/x.rb:12:in 'call')" for a log line.
      def self.describe(error)
        origin = error.backtrace&.first
        "#{error.class}: #{readable(error.message)}#{" (#{readable(origin)})" if origin}"
      end

      # True when the message was handled, :buried when it went to the dead letters (both: done with);
      # false when a shutdown interrupted a backoff: the message stays unprocessed and is delivered again
      # after the restart.
      def deliver(msg)
        attempt = 1
        loop do
          call(msg, attempt)
          Metrics::DELIVERED.add(1, Metrics::SUBSCRIBER)
          return true
        rescue *STOPS
          raise
        rescue Exception => e # standard:disable Lint/RescueException
          return bury(msg, e, attempt) unless @policy.retry?(e, attempt)
          wait = @policy.delay(attempt)
          Metrics::RETRIES.increment(1, @name)
          Herald.logger.warn "deferred subscriber #{@name} failed on #{where(msg)} (attempt #{attempt} of " \
            "#{@policy.attempts}), retrying in #{wait.round(3)} s: #{Delivery.describe(e)}"
          if Instrumentation.listening?(RETRY)
            Instrumentation.instrument(RETRY, {subscriber: @name, message: msg, error: e, attempt: attempt, wait: wait})
          end
          show_retry(msg.global_id, attempt + 1)
          return false unless @stopper.sleep(wait)
          attempt += 1
        end
      ensure
        show_retry(nil, 0) if attempt > 1
      end

      private

      # For operators only: a store that fails here fails the next read too, where the worker handles it.
      def show_retry(global_id, attempt)
        return unless @controls
        global_id ? @controls.mark_retrying(@name, global_id, attempt) : @controls.clear_retrying(@name)
      rescue Herald::Error
        nil
      end

      def call(msg, attempt)
        Events.around_handler(deferred: true) do
          event = msg.data
          next handler.call(event, msg) unless Instrumentation.listening?(PROCESS)
          payload = {subscriber: @name, event: event, message: msg, attempt: attempt, deferred: true}
          Instrumentation.instrument(PROCESS, payload) { handler.call(event, msg) }
        end
      end

      # A subscriber class reloaded since (Rails development) gets a new instance of its new code.
      def handler
        current = Events.registry.current(@subscriber)
        @handler = current.new unless current.equal?(@subscriber)
        @subscriber = current
        @handler
      end

      def where(msg) = "#{msg.channel} ##{msg.global_id}"

      def bury(msg, error, attempts)
        letter = @dead_letters.bury(@name, msg, error, attempts)
        Metrics::DEAD_LETTERS.increment(1, @name)
        Herald.logger.error "deferred subscriber #{@name} gave up on #{where(msg)} after #{attempts} " \
          "#{(attempts == 1) ? "attempt" : "attempts"}: #{Delivery.describe(error)}; dead letter " \
          "#{DeadLetters.channel(@name)} ##{letter.message_id} (`herald dead #{@name}`, `herald replay #{@name}`)"
        if Instrumentation.listening?(DEAD)
          Instrumentation.instrument(DEAD, {subscriber: @name, message: msg, error: error, attempts: attempts})
        end
        :buried
      end
    end
  end
end
