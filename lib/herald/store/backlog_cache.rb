# frozen_string_literal: true

module Herald
  module Store
    # Channel backlogs a networked store has read, kept until the store hears that the channel changed.
    # Many readers poll the same channel (every browser on a page): after the first read, the rest are
    # answered from memory. Correctness rests on the store's listener: every append, from any process,
    # is announced with its channel key, and the listener drops that channel here BEFORE it wakes any
    # reader. While the listener is not connected nothing is cached (the store reads the server).
    #
    # A fill races with announcements that arrive while its query runs: `generation` is taken before the
    # query and the fill is kept only if no announcement came in between.
    class BacklogCache
      MAX_CHANNELS = 1000

      # expires: the earliest expiry among the messages (each keeps its own age, so it need not be the first's).
      Entry = Struct.new(:from, :messages, :expires)

      attr_reader :generation

      def initialize
        @lock = Mutex.new
        @entries = {}
        @generation = 0
      end

      # Messages after last_id when the cached read covers it, else nil. Expired ones are left out.
      def fetch(key, last_id, now)
        entry = @entries[key] or return nil
        return nil if last_id < entry.from
        messages = entry.messages
        first = messages.bsearch_index { |m| m.message_id > last_id } or return []
        found = messages[first..]
        (entry.expires > now) ? found : found.select { |m| m.expires_at > now }
      end

      def store(key, from, messages, generation)
        expires = messages.empty? ? Float::INFINITY : messages.min_by(&:expires_at).expires_at
        @lock.synchronize do
          return if generation != @generation
          @entries.clear if @entries.size >= MAX_CHANNELS
          @entries[key] = Entry.new(from, messages.freeze, expires)
        end
      end

      def invalidate(key)
        @lock.synchronize do
          @generation += 1
          key ? @entries.delete(key) : @entries.clear
        end
      end

      def clear = invalidate(nil)

      # For the stores (they hold @cache and @notifier): the backlog from the cache, or from the block
      # (all messages after last_id, expired included), kept when the listener vouches for it.
      module Reads
        private

        def cached(key, last_id)
          now = Process.clock_gettime(Process::CLOCK_REALTIME)
          return Packed.unexpired(yield, now) unless @cache
          if @notifier.ready?
            found = @cache.fetch(key, last_id, now) and return found
            generation = @cache.generation
          else
            @notifier.start # from now on, this process hears about changes and can cache
          end
          messages = yield
          @cache.store(key, last_id, messages, generation) if generation
          Packed.unexpired(messages, now)
        end
      end
    end
  end
end
