# frozen_string_literal: true

module Herald
  module Store
    # Wakes the waiters of one networked store the moment any process appends. A dedicated listener
    # thread blocks on the server's push channel (Redis SUBSCRIBE, PostgreSQL LISTEN) and signals a
    # ConditionVariable on every notification, so a waiting reader is woken without a poll interval.
    #
    # `listen` runs on that thread: it connects, subscribes, calls `ready(global_id)` with the store's
    # current last global id (whatever was appended while it was not listening), then `notify(id)` for
    # every wakeup, and returns or raises when the connection is lost; it is then called again after a
    # backoff. The store also calls `notify` for its own appends, which wakes local readers at once.
    class Notifier
      BACKOFF = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0].freeze

      # on_change(channel_key or nil) runs for every announcement before any waiter is woken, and with
      # nil whenever the listener (re)connects or loses its connection (announcements may have been missed).
      def initialize(listen:, on_error:, on_change: nil)
        @listen = listen
        @on_error = on_error
        @on_change = on_change
        @thread = nil
        @pid = nil
        @latest = 0
        @ready = false
        @stopped = false
        reset_locks
      end

      def ready? = @ready && @pid == ForkTracker.pid && !@stopped

      # The highest global id announced (or appended here) so far.
      attr_reader :latest

      def notify(global_id, channel_key = nil)
        @on_change&.call(channel_key)
        return if global_id <= @latest
        @lock.synchronize do
          @latest = global_id if global_id > @latest
          @cond.broadcast
        end
      end

      def ready(global_id)
        @on_change&.call(nil)
        @lock.synchronize do
          @ready = true
          @failures = 0
          @latest = global_id if global_id > @latest
          @cond.broadcast
        end
      end

      # The store was reset (a new epoch): ids may restart below the latest announced. Waiters on the old
      # ids would return at once forever (a spin): the latest is what the new epoch has.
      def reset(global_id)
        @lock.synchronize do
          @latest = global_id
          @cond.broadcast
        end
      end

      # Blocks until an id beyond `last_global_id` is known or the timeout passes; returns the latest id.
      def wait(last_global_id, timeout)
        start
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        @lock.synchronize do
          until (@ready && @latest > last_global_id) || @stopped
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0
            @cond.wait(@lock, left)
          end
          raise ClosedError, "store is closed" if @stopped
          @latest
        end
      end

      def start
        return if @thread && @pid == ForkTracker.pid
        reset_locks if @pid # forked: the parent's thread does not exist here
        @pid = ForkTracker.pid
        @ready = false
        @thread = Thread.new { run }
        @thread.name = "herald-listener"
        @thread.report_on_exception = false
      end

      def stop
        @stopped = true
        @lock.synchronize { @cond.broadcast }
        @thread&.kill if @pid == ForkTracker.pid
        @thread = nil
      end

      private

      def reset_locks
        @lock = Mutex.new
        @cond = ConditionVariable.new
        @failures = 0
      end

      def run
        until @stopped
          begin
            @listen.call(self)
          rescue => e
            @on_error.call(e)
          end
          @ready = false
          @on_change&.call(nil)
          sleep BACKOFF[[@failures, BACKOFF.size - 1].min]
          @failures += 1
        end
      end
    end
  end
end
