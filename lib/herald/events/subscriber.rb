# frozen_string_literal: true

module Herald
  # A class that handles events:
  #
  #   class SendWelcomeEmail
  #     include Herald::Subscriber
  #     subscribe_to UserRegistered          # an event class (and its subclasses), or a channel like "/orders"
  #     deferred                             # omit to run synchronously inside Herald.publish_event
  #                                          # (`deferred start: :oldest` to begin with retained history)
  #     retry_on StandardError, attempts: 5  # deferred only: exponential backoff between attempts
  #     def call(event, message) = ...       # message: global_id, message_id, channel, created_at
  #   end
  #
  # Synchronous subscribers get a new instance per event, on the publishing thread. A deferred subscriber
  # gets one instance per process, called from one worker thread at a time, in log order: keep no
  # per-event state in instance variables. Its name (the class name, or `subscriber_name "..."`) names
  # its cursor, its lease and its dead-letter channel, so renaming the class starts it afresh.
  #
  # Where a deferred subscriber starts the first time it runs (no saved cursor yet): `start: :now` (the
  # default) handles the events published from when its process started its workers on, none from before
  # it existed; `start: :oldest` first handles every event the store still retains (a backfill). Once
  # its cursor is saved, it always resumes after it.
  module Subscriber
    def self.included(base)
      base.extend(ClassMethods)
    end

    # How a deferred subscriber retries: `attempts` calls in all, waiting wait, 2*wait, 4*wait... (at most
    # max_wait seconds) between them, for errors that are one of `errors`.
    RetryPolicy = Struct.new(:errors, :attempts, :wait, :max_wait) do
      def retry?(error, attempt) = attempt < attempts && errors.any? { |e| error.is_a?(e) }

      def delay(attempt) = [wait * (2**(attempt - 1)), max_wait].min
    end
    NO_RETRY = RetryPolicy.new([].freeze, 1, 0, 0).freeze
    STARTS = %i[now oldest].freeze

    module ClassMethods
      def subscribe_to(*targets)
        raise SubscriberError, "#{self}: subscribe_to needs an event class or a channel String" if targets.empty?
        targets.each do |t|
          next if t.is_a?(Module) || (t.is_a?(String) && !t.empty?)
          raise SubscriberError, "#{self}: subscribe_to takes event classes or channel names, got #{t.inspect}"
        end
        @herald_targets = (herald_targets + targets).freeze
        Events.registry.register(self)
      end

      def deferred(value = true, start: :now)
        raise SubscriberError, "#{self}: deferred start: must be one of #{STARTS.inspect}, got #{start.inspect}" unless STARTS.include?(start)
        @herald_deferred = value
        @herald_start = start
        Events.registry.changed
      end

      def retry_on(*errors, attempts:, wait: 0.1, max_wait: 30)
        errors = [StandardError] if errors.empty?
        raise SubscriberError, "#{self}: retry_on attempts must be an Integer >= 1" unless attempts.is_a?(Integer) && attempts >= 1
        raise SubscriberError, "#{self}: retry_on wait must be a number of seconds >= 0" unless wait.is_a?(Numeric) && wait >= 0
        @herald_retry = RetryPolicy.new(errors.freeze, attempts, wait, max_wait).freeze
      end

      def subscriber_name(name = nil)
        @herald_name = name.to_s if name
        @herald_name || self.name || raise(SubscriberError, "#{inspect} has no name: assign it to a constant or call subscriber_name")
      end

      def herald_targets = @herald_targets || [].freeze

      def deferred? = @herald_deferred || false

      # :now or :oldest: where a deferred subscriber with no saved cursor begins.
      def herald_start = @herald_start || :now

      def retry_policy = @herald_retry || NO_RETRY

      # The channel this subscriber's class targets match, decided from the event class found there.
      def handles?(event_class, channel)
        herald_targets.any? { |t| t.is_a?(String) ? t == channel : event_class <= t }
      end
    end
  end
end
