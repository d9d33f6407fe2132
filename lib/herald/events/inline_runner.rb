# frozen_string_literal: true

require "set"

module Herald
  module Events
    # Runs the deferred subscribers on the calling thread, for tests (Herald::TestHelper#perform_published_events,
    # as ActiveJob's perform_enqueued_jobs): each message after a global id goes to every deferred subscriber
    # whose targets match, once, in log order; what the handlers publish is handled in turn. No retries, no
    # dead letters, no cursors: a handler's exception propagates to the test.
    class InlineRunner
      MAX_ROUNDS = 100

      def initialize(store, registry: Events.registry)
        @store = store
        @registry = registry
      end

      # Handles every message with global_id > after whose id is not in `done` (a Set), adding each to it.
      def run(after, done: Set.new)
        MAX_ROUNDS.times do
          messages = @store.global_backlog(after)
          return done if messages.empty?
          messages.each do |msg|
            after = msg.global_id
            deliver(msg) if done.add?(msg.global_id)
          end
        end
        raise SubscriberError, "deferred subscribers still published new messages after #{MAX_ROUNDS} rounds: " \
          "does a subscriber publish what it handles?"
      end

      private

      def deliver(msg)
        subscribers = @registry.deferred
        return if subscribers.empty?
        event_class = msg.codec.equal?(Codec::Event) ? msg.data.class : nil
        subscribers.each do |s|
          next unless s.herald_targets.any? { |t| t.is_a?(String) ? t == msg.channel : event_class && event_class <= t }
          Events.around_handler(deferred: true) { s.new.call(msg.data, msg) }
        end
      end
    end
  end
end
