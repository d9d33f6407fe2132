# frozen_string_literal: true

module Herald
  class Web
    # One durable subscriber as the store knows it: cursor, how far behind the log it is (in its own
    # events, and in seconds since the oldest it has not handled), pause flag, lease holder, dead letters.
    # Subscribers are the deferred ones this process declares, those named by Herald::Web.subscribers
    # (workers elsewhere), and those named by dead-letter channels among the latest WINDOW messages.
    class SubscriberStatus
      LAG_SCAN = 10_000 # messages read past a cursor to count its lag ("10000+" beyond)
      WINDOW = 10_000
      RATE_AFTER = 1.0 # seconds between two samples of a cursor for its events/s

      # The cursors this process saw on earlier page loads: events/s is the subscriber's events between two.
      Sample = Struct.new(:cursor, :at, :rate)
      @samples = {}
      @samples_lock = Mutex.new

      def self.sample(key, &block) = @samples_lock.synchronize { block.call(@samples[key]).tap { |s| @samples[key] = s } }

      Row = Struct.new(:name, :subscriber, :cursor, :lag, :lag_more, :lag_seconds, :paused, :holder, :dead, :retrying, :rate, :error,
        keyword_init: true)

      def self.names(store)
        declared = Events.registry.deferred.map(&:subscriber_name) + Array(Web.subscribers).map(&:to_s)
        (declared + dead_letter_names(store)).uniq.sort
      end

      # Names seen on dead-letter channels: the window is read once, then only what was appended since
      # (kept per store and epoch in this process; a page load does not read 10,000 messages again).
      def self.dead_letter_names(store)
        @seen_lock.synchronize do
          last = store.last_global_id
          seen = (@seen[[store.object_id, store.epoch]] ||= [0, Set.new])
          from = [seen[0], last - WINDOW, 0].max
          store.global_backlog(from, limit: WINDOW).each do |m|
            seen[1] << m.channel.delete_prefix(Events::DeadLetters::PREFIX) if m.channel.start_with?(Events::DeadLetters::PREFIX)
          end
          seen[0] = last
          seen[1].to_a
        end
      end
      @seen = {}
      @seen_lock = Mutex.new

      def initialize(store)
        @store = store
        @dead = Events::DeadLetters.new(store)
      end

      def subscriber(name)
        Events.registry.deferred.find { |s| s.subscriber_name == name }
      end

      def row(name)
        klass = subscriber(name)
        cursor = @store.load_cursor(name, default: nil)
        holder = @store.lease_holder(name)
        # A retry mark outlives a worker killed in its backoff: shown only while someone holds the lease.
        row = Row.new(name: name, subscriber: klass, cursor: cursor, paused: @store.paused?(name),
          holder: holder, dead: @dead.pending(name).size, retrying: holder && @store.retrying(name))
        if cursor
          lag(row, klass)
          row.rate = rate(name, cursor, klass)
        end
        row
      rescue CorruptCursorError => e
        Row.new(name: name, subscriber: klass, error: e.message, paused: @store.paused?(name), dead: 0)
      end

      private

      # Counted on this subscriber's own events when its class is loaded here, else on every message.
      def lag(row, klass)
        batch = @store.global_backlog(row.cursor, limit: LAG_SCAN)
        matcher = Matcher.new(klass)
        mine = batch.select { |m| matcher.match?(m) }
        row.lag = mine.size
        row.lag_more = batch.size == LAG_SCAN
        row.lag_seconds = mine.first && [Process.clock_gettime(Process::CLOCK_REALTIME) - mine.first.created_at, 0].max
      end

      # Events/s since the sample taken at least RATE_AFTER ago (nil on the first look, or after a reset).
      def rate(name, cursor, klass)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        sample = self.class.sample([@store.epoch, name]) do |prev|
          next Sample.new(cursor, now, nil) if prev.nil? || cursor < prev.cursor
          next prev if now - prev.at < RATE_AFTER
          matcher = Matcher.new(klass)
          done = @store.global_backlog(prev.cursor, limit: LAG_SCAN).count { |m| m.global_id <= cursor && matcher.match?(m) }
          Sample.new(cursor, now, done / (now - prev.at))
        end
        sample.rate
      end

      # The same choice as Events::Worker#match?, cached per channel.
      class Matcher
        def initialize(klass)
          @all = klass.nil?
          targets = klass ? klass.herald_targets : []
          @channels = targets.grep(String)
          @classes = targets.grep(Module)
          @cache = {}
        end

        def match?(msg)
          return true if @all
          @cache.fetch(msg.channel) { @cache[msg.channel] = decide(msg) }
        end

        private

        def decide(msg)
          return true if @channels.include?(msg.channel)
          return false if @classes.empty? || !msg.codec.equal?(Codec::Event)
          klass = msg.data.class
          @classes.any? { |c| klass <= c }
        rescue UnknownEventClassError
          false
        end
      end
    end
  end
end
