# frozen_string_literal: true

module Herald
  module Store
    # What the two server stores (Redis, Postgres) share: a Pool of connections, a Notifier whose listener
    # wakes readers, and a BacklogCache. The including class sets @pool, @notifier, @cache and @closed, and
    # defines READ_RETRY_ON (the errors that mean a lost connection), RETRIES (the backoff, in seconds) and
    # `lost_connection(error)` (the message of the ConnectionError to raise).
    module Networked
      include BacklogCache::Reads

      def wait(last_global_id, timeout:)
        raise ClosedError, "store is closed" if @closed
        @notifier.wait(last_global_id, timeout)
      end

      private

      # Reads are retried with backoff after a lost connection: a read has no effect to repeat, and readers
      # keep their place. Writes are not (a publish may have been stored before the connection died).
      def read(&block)
        attempt = 0
        begin
          @pool.with(&block)
        rescue *self.class::READ_RETRY_ON => e
          raise ConnectionError, lost_connection(e) if attempt >= self.class::RETRIES.size || @closed
          sleep self.class::RETRIES[attempt]
          attempt += 1
          retry
        end
      end
    end
  end
end
