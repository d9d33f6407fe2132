# frozen_string_literal: true

module Herald
  # Herald's instrumentation events (docs/instrumentation.md for users; none carries a client id: it is a bearer token):
  #   publish_message.herald {channel:, site_id:, bytes:, targeted:, message_id:, global_id:}
  #                   around every Herald.publish / Bus#publish(_message); bytes: the encoded data;
  #                   the ids are set when the store has appended
  #   poll.herald     {channels:, mode:, status:, messages:, parked:}  around one request to the middleware
  #                   (mode :long_poll, :chunked, :sse or :short_poll; status the HTTP status; messages
  #                   the number in the reply, or in a stream's first bytes; parked: held for later)
  #   deliver.herald  {mode:, encoding:, messages:}  a parked client was handed messages (its reply, or a
  #                   chunk of its stream), on the middleware's event loop thread; not timed
  #   publish.herald  {channel:, event:, message:}   around Herald.publish_event (sync subscribers included;
  #                   message: the stored Herald::Message, set once stored)
  #   process.herald  {subscriber:, event:, message:, attempt:, deferred:}  around one handler call, sync
  #                   (deferred: false) or deferred (+ exception:, exception_object: when it raised, as
  #                   ActiveSupport names them)
  #   retry.herald    {subscriber:, message:, error:, attempt:, wait:}   a failed attempt that will be retried
  #   dead.herald     {subscriber:, message:, error:, attempts:}         an event given up on (dead letter)
  #
  # Each costs one `listening?` check when nobody listens: no payload is built, nothing is timed.
  #
  # They go to ActiveSupport::Notifications when it is loaded (subscribe there as usual), and always to
  # the plain callbacks registered here, which need nothing else:
  #
  #   sub = Herald::Instrumentation.subscribe("dead.herald") { |name, payload, duration| ... }
  #   Herald::Instrumentation.unsubscribe(sub)
  #
  # `duration` is in seconds (nil for events that are not timed). A callback that raises is reported
  # through Herald.logger and never breaks the publish or the worker.
  module Instrumentation
    Callback = Struct.new(:name, :block)

    @callbacks = [].freeze
    @notifications = nil # ActiveSupport::Notifications, once it is loaded
    @lock = Mutex.new

    class << self
      def subscribe(name = nil, &block)
        raise InvalidArgumentError, "Herald::Instrumentation.subscribe needs a block" unless block
        callback = Callback.new(name, block)
        @lock.synchronize { @callbacks = (@callbacks + [callback]).freeze }
        callback
      end

      def unsubscribe(callback)
        @lock.synchronize { @callbacks = (@callbacks - [callback]).freeze }
      end

      # True when anybody listens to `name`: callers skip building payloads (and timing) otherwise. Asked on
      # every poll and publish, so written for the case where nobody listens (1,650 instructions a call
      # instead of 2,000: callgrind, bench/middleware_cpu_bench.rb's approach): `defined?` from the top level
      # (from in here Ruby searched Herald's scopes first), ActiveSupport::Notifications kept once loaded.
      # ActiveSupport loaded later, and subscribers added later on either side, are seen on the next call.
      def listening?(name)
        callbacks = @callbacks
        return true if !callbacks.empty? && callbacks.any? { |c| c.name.nil? || c.name == name }
        notifications = @notifications || (defined?(::ActiveSupport::Notifications) && (@notifications = ::ActiveSupport::Notifications))
        notifications ? notifications.notifier.listening?(name) : false
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
