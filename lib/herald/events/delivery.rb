# frozen_string_literal: true

module Herald
  module Events
    # Calls one deferred subscriber's handler for one message: retries with exponential backoff, then
    # the dead-letter channel. Runs on the subscriber's worker thread, so a backoff holds back that
    # subscriber's later events (order per subscriber is kept) and no other subscriber's.
    class Delivery
      PROCESS = "process.herald"
      RETRY = "retry.herald"
      DEAD = "dead.herald"

      def initialize(subscriber, handler, dead_letters:, stopper:)
        @subscriber = subscriber
        @name = subscriber.subscriber_name
        @handler = handler
        @policy = subscriber.retry_policy
        @dead_letters = dead_letters
        @stopper = stopper
      end

      # True when the message is done with (handled, or buried as a dead letter); false when a shutdown
      # interrupted a backoff: the message stays unprocessed and is delivered again after the restart.
      def deliver(msg)
        attempt = 1
        loop do
          call(msg, attempt)
          return true
        rescue => e
          return bury(msg, e, attempt) unless @policy.retry?(e, attempt)
          wait = @policy.delay(attempt)
          if Instrumentation.listening?(RETRY)
            Instrumentation.instrument(RETRY, {subscriber: @name, message: msg, error: e, attempt: attempt, wait: wait})
          end
          return false unless @stopper.sleep(wait)
          attempt += 1
        end
      end

      private

      def call(msg, attempt)
        event = msg.data
        return @handler.call(event, msg) unless Instrumentation.listening?(PROCESS)
        payload = {subscriber: @name, event: event, message: msg, attempt: attempt}
        Instrumentation.instrument(PROCESS, payload) { @handler.call(event, msg) }
      end

      def bury(msg, error, attempts)
        @dead_letters.bury(@name, msg, error, attempts)
        if Instrumentation.listening?(DEAD)
          Instrumentation.instrument(DEAD, {subscriber: @name, message: msg, error: error, attempts: attempts})
        end
        true
      end
    end
  end
end
