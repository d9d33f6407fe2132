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
      REFRESH_EVERY = 1.0 # seconds between calls of `refresh` (development: code reloading)
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
      # on) and with what stopped a subscriber (FATAL). refresh, when given, is called by the first thread
      # about every REFRESH_EVERY seconds (the runtime reloads code and adds new subscribers with #add);
      # that thread runs even with no subscriber yet.
      def initialize(store:, subscribers:, threads:, on_error: nil, refresh: nil)
        @store = store
        @stopper = Stopper.new
        @on_error = on_error || LOG_ERROR
        @refresh = refresh
        @next_refresh = 0.0
        @workers = subscribers.map { |s| Worker.new(s, store: store, stopper: @stopper) }
        @resting = {} # worker => until when it is left alone after an error outside its handler
        @lock = Mutex.new
        groups = Array.new(@workers.size.clamp(refresh ? 1 : 0, threads)) { [] }
        @workers.each_with_index { |w, i| groups[i % groups.size] << w }
        @threads = []
        groups.each_with_index { |group, slot| @lock.synchronize { @threads[slot] = start_thread(group, slot) } }
      end

      # Stops taking work; lets in-flight handlers finish until `timeout` (minus the time kept back for
      # saving cursors), then abandons them (Thread#kill: those events run again after a restart); saves
      # every cursor exactly and releases the leases. Returns true when nothing had to be abandoned.
      def shutdown(timeout:)
        deadline = monotonic + timeout
        @stopper.stop!
        finish_by = deadline - [0.1, timeout * 0.2].min
        threads = @lock.synchronize { @threads.dup } # none is restarted once stopped (restart)
        threads.each { |t| t.join([finish_by - monotonic, 0].max) }
        abandoned = threads.select(&:alive?)
        abandoned.each { |t| t.kill.join([deadline - monotonic, 0.01].max) }
        @workers.each { |w| finish(w) }
        abandoned.empty?
      end

      def forget_after_fork = @workers.each(&:forget_after_fork)

      # Subscribers declared while the pool runs (a new file in development): a thread of their own. A new
      # one with no cursor starts after `now`, the last global id seen before it was declared.
      def add(subscribers, now:)
        @lock.synchronize do
          return if @stopper.stopped?
          added = subscribers.map { |s| Worker.new(s, store: @store, stopper: @stopper, now: now) }
          @workers += added
          @threads << start_thread(added, @threads.size)
        end
      end

      private

      # How long the subscribers of a thread that died stay away from their leases in this process: a
      # standby process (trying every Worker::LEASE_RETRY) takes over first.
      COOL_OFF = 2 * Worker::LEASE_RETRY
      # Errors about the store itself, not one subscriber: the thread waits and tries again (IDLE_WAIT).
      STORE_ERRORS = [ClosedError, ConnectionError].freeze

      def start_thread(group, slot)
        Thread.new { run(group, slot) }.tap do |t|
          t.name = "herald-events-#{slot}"
          t.report_on_exception = false # what ends it is logged here (restart)
        end
      end

      # A worker that keeps pace with a busy publisher would read one event per wakeup: a thread switch and
      # a lock round trip per event. After a small batch it lingers LINGER seconds, so the next read takes a
      # whole burst (deferred work is late by at most that much).
      #
      # Nothing a handler raises ends the thread (Delivery contains it). A handler stopping the process
      # (Delivery::STOPS) has this thread's cursors saved and leases freed first (`stopping`); anything
      # else that ends the thread (Thread#kill or Thread.exit in a handler) has them freed and the thread
      # restarted (`restart`).
      def run(workers, slot)
        ended = false
        begin
          serve(workers, slot)
          ended = true
        rescue ClosedError
          ended = true # the store was closed under us: nothing left to read
        rescue *Delivery::STOPS => e
          ended = true # not restarted: the process is stopping
          stopping(workers, e)
        rescue Exception => e # standard:disable Lint/RescueException
          @on_error.call(e, workers.map(&:name).join(", "))
          @stopper.sleep(IDLE_WAIT)
          retry unless @stopper.stopped?
          ended = true
        ensure
          restart(workers, slot, $!) unless ended || @stopper.stopped?
        end
      end

      def serve(workers, slot)
        until @stopper.stopped?
          refresh if slot.zero? && @refresh && monotonic >= @next_refresh
          seen = @store.last_global_id
          read = 0
          workers.each { |w| read += step(w) }
          if read.zero?
            @store.wait(seen, timeout: IDLE_WAIT) unless @stopper.stopped?
          elsif read < SMALL_BATCH
            @stopper.sleep(LINGER)
          end
        end
      end

      # A failed reload (a syntax error in a file being edited) is logged; the next refresh tries again.
      def refresh
        @next_refresh = monotonic + REFRESH_EVERY
        @refresh.call
      rescue *Delivery::STOPS, *STORE_ERRORS
        raise
      rescue Exception => e # standard:disable Lint/RescueException
        Herald.logger.error "reloading deferred subscribers failed: #{Delivery.describe(e)}"
      end

      # One subscriber's failure outside its handler (an event it cannot decode, a dead letter it cannot
      # write) is its own: the others on the thread go on, and it is tried again after IDLE_WAIT.
      def step(worker)
        return 0 if (resting = @resting[worker]) && monotonic < resting
        worker.step
      rescue *FATAL => e
        worker.stop!(e)
        @on_error.call(e, worker.name)
        0
      rescue *Delivery::STOPS, *STORE_ERRORS
        raise
      rescue Exception => e # standard:disable Lint/RescueException
        @on_error.call(e, worker.name)
        @resting[worker] = monotonic + IDLE_WAIT
        0
      end

      # A handler raised Interrupt, SignalException or SystemExit: it means the process, so it goes on to
      # the main thread (as if the handler had run there), once this thread's cursors are saved and its
      # leases free for a standby process.
      def stopping(workers, error)
        workers.each { |w| hand_over(w) }
        Herald.logger.error "deferred subscribers #{workers.map(&:name).join(", ")}: a handler raised " \
          "#{Delivery.describe(error)}; cursors saved and leases released, raising it in the main thread"
        Thread.main.raise(error) unless Thread.current == Thread.main
      end

      # The thread ended without being asked to: its subscribers' leases are freed at once (a standby
      # process takes over) and a new thread serves them here, taking leases again after COOL_OFF.
      def restart(workers, slot, error)
        Herald.logger.error "deferred subscribers #{workers.map(&:name).join(", ")}: their worker thread " \
          "#{error ? "ended (#{Delivery.describe(error)})" : "was killed"}; leases released, a new thread " \
          "takes them again after #{COOL_OFF} s"
        workers.each { |w| hand_over(w) }
        @lock.synchronize { @threads[slot] = start_thread(workers, slot) unless @stopper.stopped? }
      end

      def hand_over(worker)
        worker.hand_over(cool_off: COOL_OFF)
      rescue Exception => e # standard:disable Lint/RescueException
        @on_error.call(e, worker.name)
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
