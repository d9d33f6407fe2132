# frozen_string_literal: true

module Herald
  module Store
    # What the two server stores (Redis, Postgres) share: a Pool of connections, a Notifier whose listener
    # wakes readers, and a BacklogCache. The including class sets @pool, @notifier, @cache and @closed, and
    # defines RETRIES (the backoff, in seconds), `retry_read?(error)` (a lost connection, a server still
    # loading), `retry_write?(error)` (the server refused the command without running it) and
    # `herald_error(error)` (the Herald::Error to raise instead: nothing else reaches user code).
    module Networked
      include BacklogCache::Reads

      # Reads are round trips: an event loop must not wait for them (Store contract, "Capabilities").
      def local_reads? = false

      def data_dir = nil # nothing on this machine's disk

      def bytes_on_disk = nil

      # No callbacks: a watcher would have to read over the network from the appending thread.
      def watch = nil

      def peek_last_global_id = last_global_id

      # Nothing is carried by the wakeups (Redis overrides this): readers read global_backlog.
      def announced_backlog(_last_id, limit: nil) = nil

      def wait(last_global_id, timeout:)
        Limits.validate_wait!(last_global_id, timeout)
        raise ClosedError, "store is closed" if @closed
        @notifier.wait(last_global_id, timeout)
      end

      private

      # Reads are retried with backoff after a lost connection: a read has no effect to repeat, and readers
      # keep their place. Writes only when nothing ran: the server refused the command, or no connection
      # could be made (a publish may have been stored before a connection died). A timeout is not retried: the server is stalled, and the caller
      # was promised an answer within `timeout`. No retry starts once the backoff's total has passed, so a
      # call ends within about RETRIES.sum + connect_timeout + timeout even when each attempt is slow.
      def read(&block) = with_retries(:retry_read?, &block)

      def write(&block) = with_retries(:retry_write?, &block)

      def with_retries(retryable)
        attempt = 0
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        begin
          @pool.with { |conn| yield conn }
        rescue => e
          raise herald_error(e) if attempt >= self.class::RETRIES.size || @closed || !send(retryable, e) || retries_spent?(started)
          sleep self.class::RETRIES[attempt]
          attempt += 1
          retry
        end
      end

      def retries_spent?(started) = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started > self.class::RETRIES.sum
    end
  end
end
