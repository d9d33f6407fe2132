# frozen_string_literal: true

module Herald
  module Events
    # Event channels keep this many events each (message_bus-style retention by count): a deferred
    # subscriber that falls further behind than this on one channel misses the oldest. Raise it for
    # bursty producers; the Log store keeps retained messages indexed in memory.
    DEFAULT_MAX_BACKLOG_SIZE = 100_000
    DEFAULT_THREADS = 2

    # This process's side of events: publishing (with sync subscribers) and the worker pool of the
    # deferred ones. Workers start on the first publish_event once a deferred subscriber is declared (or
    # with Herald.start_workers), and after a fork start afresh in the child on its first call. Deferred
    # subscribers declared after the workers started join at the next start of the process.
    class Runtime
      PUBLISH = "publish.herald"

      attr_accessor :max_backlog_size, :threads

      def initialize
        @lock = Mutex.new
        @pool = nil
        @checked = nil # the registry generation last looked at for deferred subscribers
        @stopped = false
        @max_backlog_size = DEFAULT_MAX_BACKLOG_SIZE
        @threads = DEFAULT_THREADS
      end

      # Stores the event, runs the synchronous subscribers, returns the stored Herald::Message.
      # A synchronous subscriber's exception propagates out of here: the event is already stored (deferred
      # subscribers still get it) and the sync subscribers after the failing one do not run.
      def publish(event, channel, bus)
        registry = Events.registry
        channel ||= registry.channel_for(event.class)
        channel = bus.check_channel!(channel) # the same names as Bus#publish: events append through the store itself
        start(bus) unless @pool || @checked == registry.generation || !Events.autostart
        return store(event, channel, bus, registry) unless Instrumentation.listening?(PUBLISH)
        payload = {channel: channel, event: event}
        Instrumentation.instrument(PUBLISH, payload) { payload[:message] = store(event, channel, bus, registry) }
      end

      def start(bus, threads: @threads)
        @lock.synchronize do
          return @pool if @pool || @stopped
          @checked = Events.registry.generation
          deferred = Events.registry.deferred
          @pool = WorkerPool.new(store: bus.store, subscribers: deferred, threads: threads) unless deferred.empty?
        end
      end

      def running? = !@pool.nil?

      def workers = @pool ? @pool.workers : []

      # Graceful: see WorkerPool#shutdown. Later publishes are still stored; no workers start again.
      def shutdown(timeout:)
        pool = @lock.synchronize do
          @stopped = true
          @pool.tap { @pool = nil }
        end
        pool ? pool.shutdown(timeout: timeout) : true
      end

      def after_fork
        @pool&.forget_after_fork
        @pool = nil
        @checked = nil
        @lock = Mutex.new
      end

      private

      def store(event, channel, bus, registry)
        msg = bus.store.append(channel, Codec::Event.encode(event), codec: Codec::Event,
          max_backlog_size: @max_backlog_size)
        registry.sync_for(event.class, channel).each { |s| Events.around_handler { call_sync(s, event, msg) } }
        msg
      end

      def call_sync(subscriber, event, msg)
        return subscriber.new.call(event, msg) unless Instrumentation.listening?(Delivery::PROCESS)
        payload = {subscriber: subscriber.subscriber_name, event: event, message: msg, attempt: 1, deferred: false}
        Instrumentation.instrument(Delivery::PROCESS, payload) { subscriber.new.call(event, msg) }
      end
    end

    @runtime = Runtime.new
    @handler_wrapper = nil
    @autostart = true

    class << self
      attr_reader :runtime

      # A callable taking a block, run around every handler call, sync and deferred: the Railtie wraps
      # handlers in the Rails reloader/executor (connections checked back in, code reloaded in development).
      attr_accessor :handler_wrapper

      # False: publish_event never starts workers; only Herald.start_workers does (the Railtie turns it off,
      # so `rails runner` and rake publish without taking leases; the Puma plugin starts them in servers).
      attr_accessor :autostart

      def around_handler(deferred: false, &block) = @handler_wrapper ? @handler_wrapper.call(deferred: deferred, &block) : yield

      def reset_runtime!(timeout: 1)
        @runtime.shutdown(timeout: timeout)
        @runtime = Runtime.new
      end
    end

    # Threads do not survive fork: the child drops its copy of the parent's workers (and their lease
    # files, so a lease is freed when its real owner dies) and starts its own on first use.
    module ForkHook
      def _fork
        pid = super
        Events.runtime.after_fork if pid == 0
        pid
      end
    end
    Process.singleton_class.prepend(ForkHook)
  end

  class << self
    # Publishes an event on its class's channel ("/events/user_registered") or `channel:`. Returns the
    # message id (per channel, as publish does).
    def publish_event(event, channel: nil) = Events.runtime.publish(event, channel, bus).message_id

    # Starts the deferred subscribers' workers now rather than on the first publish_event
    # (worker-only processes).
    def start_workers(threads: Events.runtime.threads) = Events.runtime.start(bus, threads: threads)

    def dead_letters = Events::DeadLetters.new(bus.store)

    # Stops the workers: see Herald::Events::WorkerPool#shutdown. True when no work was abandoned.
    # Callable from a signal handler (Puma single mode runs its stop hooks inside its SIGTERM trap, where
    # Mutex#lock raises ThreadError): there the work runs on a thread of its own, joined for as long.
    def shutdown(timeout: 25)
      return Events.runtime.shutdown(timeout: timeout) unless in_trap?
      worker = Thread.new { Events.runtime.shutdown(timeout: timeout) }
      worker.join(timeout + 1) ? worker.value : false
    end

    private

    # Ruby has no flag for it: a trap handler is the one place where locking a fresh Mutex raises.
    def in_trap?
      Mutex.new.synchronize { false }
    rescue ThreadError
      true
    end
  end
end
