# frozen_string_literal: true

module Herald
  module Events
    # Tells workers to stop, and lets backoff sleeps end early when they must.
    class Stopper
      def initialize
        @lock = Mutex.new
        @cond = ConditionVariable.new
        @stopped = false
      end

      def stopped? = @stopped

      def stop!
        @lock.synchronize do
          @stopped = true
          @cond.broadcast
        end
      end

      # Sleeps up to `seconds`; false when stopped meanwhile.
      def sleep(seconds)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
        @lock.synchronize do
          until @stopped
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0
            @cond.wait(@lock, left)
          end
        end
        !@stopped
      end
    end

    # The threads running this process's deferred subscribers. Subscribers are spread over at most
    # `threads` threads; a thread serves its subscribers in turn, one batch each, and waits on the store
    # (woken by appends from any process) when none had work. No per-event handoff between threads.
    class WorkerPool
      IDLE_WAIT = 0.25
      LINGER = 0.005
      SMALL_BATCH = 256

      attr_reader :workers

      # Errors that stop one subscriber for good (the others keep running): its cursor cannot be trusted.
      FATAL = [CorruptCursorError].freeze

      # The default on_error: a line through Herald.logger.
      LOG_ERROR = lambda do |e, name|
        what = (FATAL.any? { |f| e.is_a?(f) }) ? "stopped" : "failed"
        Herald.logger.error "deferred subscriber #{name} #{what}: #{Delivery.describe(e)}"
      end

      # on_error(error, names) is called with what a worker thread raised (it then waits IDLE_WAIT and goes
      # on) and with what stopped a subscriber (FATAL).
      def initialize(store:, subscribers:, threads:, on_error: nil)
        @store = store
        @stopper = Stopper.new
        @on_error = on_error || LOG_ERROR
        @workers = subscribers.map { |s| Worker.new(s, store: store, stopper: @stopper) }
        groups = Array.new([threads, @workers.size].min) { [] }
        @workers.each_with_index { |w, i| groups[i % groups.size] << w }
        @threads = groups.map { |group| Thread.new { run(group) } }
      end

      # Stops taking work; lets in-flight handlers finish until `timeout` (minus the time kept back for
      # saving cursors), then abandons them (Thread#kill: those events run again after a restart); saves
      # every cursor exactly and releases the leases. Returns true when nothing had to be abandoned.
      def shutdown(timeout:)
        deadline = monotonic + timeout
        @stopper.stop!
        finish_by = deadline - [0.1, timeout * 0.2].min
        @threads.each { |t| t.join([finish_by - monotonic, 0].max) }
        abandoned = @threads.select(&:alive?)
        abandoned.each { |t| t.kill.join([deadline - monotonic, 0.01].max) }
        @workers.each { |w| finish(w) }
        abandoned.empty?
      end

      def forget_after_fork = @workers.each(&:forget_after_fork)

      private

      # A worker that keeps pace with a busy publisher would read one event per wakeup: a thread switch and
      # a lock round trip per event. After a small batch it lingers LINGER seconds, so the next read takes a
      # whole burst (deferred work is late by at most that much).
      def run(workers)
        until @stopper.stopped?
          seen = @store.last_global_id
          read = 0
          workers.each { |w| read += step(w) }
          if read.zero?
            @store.wait(seen, timeout: IDLE_WAIT) unless @stopper.stopped?
          elsif read < SMALL_BATCH
            @stopper.sleep(LINGER)
          end
        end
      rescue ClosedError
        nil # the store was closed under us: nothing left to read
      rescue => e
        @on_error.call(e, workers.map(&:name).join(", "))
        @stopper.sleep(IDLE_WAIT)
        retry unless @stopper.stopped?
      end

      def step(worker)
        worker.step
      rescue *FATAL => e
        worker.stop!(e)
        @on_error.call(e, worker.name)
        0
      end

      def finish(worker)
        worker.finish
      rescue ClosedError
        nil # the store is closed: the cursor saved last (at most SAVE_EVERY old) stands
      rescue => e
        @on_error.call(e, worker.name)
      end

      def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
