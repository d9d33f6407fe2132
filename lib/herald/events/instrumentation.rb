# frozen_string_literal: true

module Herald
  # Herald's instrumentation events:
  #   publish.herald  {channel:, event:, message:}               around Herald.publish_event (sync subscribers included)
  #   process.herald  {subscriber:, event:, message:, attempt:}  around one handler call (+ exception:,
  #                   exception_object: when it raised, as ActiveSupport names them)
  #   retry.herald    {subscriber:, message:, error:, attempt:, wait:}   a failed attempt that will be retried
  #   dead.herald     {subscriber:, message:, error:, attempts:}         an event given up on (dead letter)
  #
  # They go to ActiveSupport::Notifications when it is loaded (subscribe there as usual), and always to
  # the plain callbacks registered here, which need nothing else:
  #
  #   sub = Herald::Instrumentation.subscribe("dead.herald") { |name, payload, duration| ... }
  #   Herald::Instrumentation.unsubscribe(sub)
  #
  # `duration` is in seconds (nil for events that are not timed). A callback that raises is reported on
  # stderr and never breaks the publish or the worker.
  module Instrumentation
    Callback = Struct.new(:name, :block)

    @callbacks = [].freeze
    @lock = Mutex.new

    class << self
      def subscribe(name = nil, &block)
        raise ArgumentError, "Herald::Instrumentation.subscribe needs a block" unless block
        callback = Callback.new(name, block)
        @lock.synchronize { @callbacks = (@callbacks + [callback]).freeze }
        callback
      end

      def unsubscribe(callback)
        @lock.synchronize { @callbacks = (@callbacks - [callback]).freeze }
      end

      # True when anybody listens to `name`: callers skip building payloads (and timing) otherwise.
      def listening?(name)
        @callbacks.any? { |c| c.name.nil? || c.name == name } || notifications_listening?(name)
      end

      # Times the block (if given) and reports it. Returns the block's value.
      def instrument(name, payload, &block)
        return (block ? yield : nil) unless listening?(name)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          notify_active_support(name, payload, &block)
        rescue Exception => e # standard:disable Lint/RescueException
          # As ActiveSupport does (it fills these in itself when loaded): listeners see what the block raised.
          payload[:exception] ||= [e.class.name, e.message]
          payload[:exception_object] ||= e
          raise
        ensure
          call_callbacks(name, payload, block ? Process.clock_gettime(Process::CLOCK_MONOTONIC) - started : nil)
        end
      end

      private

      def notifications_listening?(name)
        defined?(ActiveSupport::Notifications) ? ActiveSupport::Notifications.notifier.listening?(name) : false
      end

      def notify_active_support(name, payload, &block)
        return (block ? yield : nil) unless defined?(ActiveSupport::Notifications)
        ActiveSupport::Notifications.instrument(name, payload, &block)
      end

      def call_callbacks(name, payload, duration)
        @callbacks.each do |c|
          next unless c.name.nil? || c.name == name
          c.block.call(name, payload, duration)
        rescue => e
          Herald.logger.warn "instrumentation callback for #{name} failed: #{Events::Delivery.describe(e)}"
        end
      end
    end
  end

  def self.instrument(name, payload = {}, &block) = Instrumentation.instrument(name, payload, &block)
end
