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
        if @checked != registry.generation
          @pool ? adopt(bus.store.last_global_id) : (start(bus) if Events.autostart)
        end
        return store(event, channel, bus, registry) unless Instrumentation.listening?(PUBLISH)
        payload = {channel: channel, event: event}
        Instrumentation.instrument(PUBLISH, payload) { payload[:message] = store(event, channel, bus, registry) }
      end

      def start(bus, threads: @threads)
        @lock.synchronize do
          return @pool if @pool || @stopped
          @checked = Events.registry.generation
          deferred = Events.registry.deferred
          refresh = -> { refresh(bus) } if Events.reload_check
          return if deferred.empty? && !refresh
          @refresh_seen = bus.store.last_global_id if refresh
          @pool = WorkerPool.new(store: bus.store, subscribers: deferred, threads: threads, refresh: refresh)
        end
      end

      # Deferred subscribers declared since the workers started (a reload in development, a class
      # required late) join the running pool; `seen`: the last global id from before they were declared.
      def adopt(seen)
        @lock.synchronize do
          registry = Events.registry
          return if @pool.nil? || @checked == registry.generation
          @checked = registry.generation
          running = @pool.workers.map(&:name)
          added = registry.deferred.reject { |s| running.include?(s.subscriber_name) }
          @pool.add(added, now: seen) unless added.empty?
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

      # Called by the pool about every second when Events.reload_check is set: new code first, then new
      # subscribers. One found now was not there at the previous check, which came after the id read then:
      # they start after that id, so nothing published once the file appeared is missed.
      def refresh(bus)
        before = @refresh_seen
        @refresh_seen = bus.store.last_global_id
        Events.reload_check.call
        adopt(before || @refresh_seen)
      end

      def store(event, channel, bus, registry)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        msg = bus.store.append(channel, Codec::Event.encode(event), codec: Codec::Event,
          max_backlog_size: @max_backlog_size)
        Metrics::PUBLISH_DURATION.observe(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
        Metrics::PUBLISHED.add
        registry.sync_for(event.class, channel).each { |s| Events.around_handler { call_sync(s, event, msg) } }
        msg
      end

      def call_sync(subscriber, event, msg)
        Metrics::DELIVERED.add(1, Metrics::SUBSCRIBER)
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

      # A callable the worker pool calls about every second, reloading changed code (the Railtie sets one in
      # development, so a new file in app/subscribers runs without a restart). nil: no reloading.
      attr_accessor :reload_check

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
