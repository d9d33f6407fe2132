# frozen_string_literal: true

module Herald
  module Cable
    # The one reader of the store behind an ActionCable server in a process: it follows the store's global
    # ids from a cursor, picks out the broadcastings' channels and hands each message to the callbacks
    # subscribed to it on ActionCable's executor (`executor.post`), as the Redis adapter's listener does, but
    # in store order: ActionCable 7's executor is a pool of threads, and one task per callback let a later
    # broadcast overtake an earlier one (seen in this adapter's tests). Calls go through one queue that one
    # task at a time drains.
    # Nothing here does I/O on the caller's thread: `add` and `remove` change a Hash, so a stalled store
    # never blocks ActionCable's event loop. Two threads do the reading:
    #
    # - the reader: waits on the store (woken by appends from any process), reads what is new after its
    #   cursor, delivers it. After a failure (a lost connection, a restarted server) it keeps its cursor, logs
    #   the named error through Herald.logger and tries again with backoff: what was appended meanwhile is
    #   still read, nothing is delivered twice.
    # - the activator: makes new subscriptions live. It reads the store's last global id (the floor) once the
    #   reader has its cursor, and only then adds the callback and posts its success callback: everything
    #   broadcast after success is delivered (the reader reads past the floor), nothing broadcast before the
    #   subscription is (older messages are under the floor). While the store cannot be read, success waits.
    class Listener
      WAIT_SLICE = 0.1 # the longest a wait blocks: how soon `stop` is noticed
      BATCH = 1000
      BACKOFF = [0.05, 0.1, 0.25, 0.5, 1.0].freeze # seconds between attempts while the store fails
      Entry = Struct.new(:callback, :floor)
      # A subscribed channel: its entries (a frozen Array, replaced under the lock, read without it) and the
      # last message id delivered (the reader's alone: a jump is a broadcast this process missed).
      Subscribed = Struct.new(:entries, :last_id)

      def initialize(store:, executor:)
        @store = store
        @executor = executor
        @lock = Mutex.new
        @ready = ConditionVariable.new # signalled when the reader has its cursor
        @cursor = nil # the reader's: the last global id read (nil until the store first answered)
        @epoch = nil # the store's epoch that @cursor counts in
        @subscribers = {} # channel => Subscribed
        @pending = [] # [channel, callback, on_success] waiting for the activator
        @wakeups = Thread::Queue.new
        @stopped = false
        @threads = nil
        @outbox = [] # [callable, argument or nil], in order
        @draining = false # a task on the executor is running the outbox
        @outbox_lock = Mutex.new
      end

      def add(channel, callback, on_success)
        @lock.synchronize do
          raise ClosedError, "the ActionCable adapter was shut down" if @stopped
          @pending << [channel, callback, on_success]
          @threads ||= [spawn("herald-cable-reader") { read_loop }, spawn("herald-cable-activator") { activate_loop }]
        end
        @wakeups << true
      end

      def remove(channel, callback)
        @lock.synchronize do
          @pending.reject! { |c, cb, _| c == channel && cb == callback }
          subscribed = @subscribers[channel] or return
          subscribed.entries = subscribed.entries.reject { |e| e.callback == callback }.freeze
          @subscribers.delete(channel) if subscribed.entries.empty?
        end
      end

      def stop
        @lock.synchronize do
          @stopped = true
          @ready.broadcast
        end
        @wakeups << true
        # The reader notices within WAIT_SLICE, unless a read of a stalled server holds it (up to the store's timeout).
        @threads&.each { |t| t.join(2 * WAIT_SLICE + 1) || t.kill }
      end

      private

      def spawn(name)
        Thread.new { yield }.tap do |t|
          t.name = name
          t.report_on_exception = false
        end
      end

      # After a failure the batch shrinks: a read of many large broadcasts that outlasts a networked store's
      # timeout every time would otherwise be tried forever.
      # The cursor (@cursor, the last global id read) moves after each batch: a read that fails after earlier
      # batches were delivered must not deliver them again.
      def read_loop
        failures = 0
        limit = BATCH
        begin
          @epoch ||= @store.known_epoch
          start = @cursor || @store.last_global_id
          @lock.synchronize { @cursor = start.tap { @ready.broadcast } }
          until @stopped
            @store.wait(@cursor, timeout: WAIT_SLICE)
            reset_position unless @store.known_epoch == @epoch
            deliver_new(limit)
            failures = recovered(failures, "reading broadcasts")
            limit = BATCH
          end
        rescue ClosedError
          nil
        rescue => e
          failures = failed(e, failures, "reading broadcasts")
          limit = [limit / 10, 1].max
          retry unless @stopped
        end
      end

      # The store was reset (a flushed Redis, a replaced log directory: a new epoch). Where its ids went on
      # above the cursor, reading goes on; where it numbers its messages again, reading starts from its last id
      # and every subscription's floor comes down to it (else the first cursor-many broadcasts after the reset
      # would never be delivered). What was broadcast between the reset and now is not delivered, and said.
      def reset_position
        epoch = @store.known_epoch
        first = @store.global_backlog(0, limit: 1).first
        unless first && first.global_id > @cursor
          last = @store.last_global_id
          Herald.logger.warn "ActionCable (adapter: herald): the store was reset (epoch #{@epoch} -> #{epoch}); " \
            "reading on from its last id #{last} (was #{@cursor}): broadcasts between the reset and now were not delivered"
          @cursor = last
          @lock.synchronize do
            @subscribers.each_value do |subscribed|
              subscribed.last_id = nil
              subscribed.entries.each { |e| e.floor = last if e.floor > last }
            end
          end
        end
        @epoch = epoch
      end

      # A batch shorter than `limit` is everything there was (global_backlog reads on past expired records
      # to fill a page): the next read waits for a wakeup instead of asking again (one round trip per
      # broadcast on a networked store, not two; a wakeup that came meanwhile ends the wait at once).
      def deliver_new(limit)
        loop do
          batch = @store.announced_backlog(@cursor, limit: limit) || @store.global_backlog(@cursor, limit: limit)
          return if batch.empty?
          batch.each { |msg| deliver(msg) if Cable.channel?(msg.channel) }
          @cursor = batch.last.global_id
          return if batch.size < limit
        end
      end

      def deliver(msg)
        subscribed = @subscribers[msg.channel] or return
        check_gap(subscribed, msg)
        payload = nil
        subscribed.entries.each do |entry|
          next unless msg.global_id > entry.floor
          payload ||= Codec::Raw.decode(msg.payload)
          call_later(entry.callback, payload)
          Metrics::DELIVERED.add(1, Metrics::CABLE)
        end
      end

      # Retention dropped broadcasts this process had not read yet (a burst beyond max_backlog_size), or ids
      # jumped after an unclean stop of the log: said, never silent.
      def check_gap(subscribed, msg)
        last = subscribed.last_id
        subscribed.last_id = msg.message_id
        return unless last && msg.message_id > last + 1
        Herald.logger.warn "ActionCable (adapter: herald): #{msg.message_id - last - 1} broadcast(s) on #{msg.channel} " \
          "were not read here (message ids #{last} -> #{msg.message_id}): dropped by retention before this process " \
          "read them (raise max_backlog_size in config/cable.yml), or ids skipped after an unclean stop"
      end

      def activate_loop
        failures = 0
        until @stopped
          @wakeups.pop
          next if @lock.synchronize { @pending.empty? }
          begin
            activate(wait_for_cursor && @store.last_global_id)
            failures = recovered(failures, "confirming subscriptions")
          rescue => e
            failures = failed(e, failures, "confirming subscriptions")
            @wakeups << true # try again
          end
        end
      end

      def wait_for_cursor
        @lock.synchronize do
          @ready.wait(@lock, WAIT_SLICE) until @cursor || @stopped
          !@stopped
        end
      end

      # The floor first, then the new channels' last message ids (read after it, they are at least those of
      # every message under it): the first broadcast read on a channel is then checked for a gap too.
      def activate(floor)
        return unless floor
        fresh_channels = @lock.synchronize { @pending.map(&:first).uniq - @subscribers.keys }
        last_ids = fresh_channels.empty? ? {} : @store.last_ids(fresh_channels)
        fresh = @lock.synchronize do
          @pending.shift(@pending.size).each do |channel, callback, _|
            subscribed = (@subscribers[channel] ||= Subscribed.new([].freeze, last_ids[channel]))
            subscribed.entries = [*subscribed.entries, Entry.new(callback, floor)].freeze
          end
        end
        fresh.each { |_, _, on_success| call_later(on_success) if on_success }
      end

      def call_later(callable, *args)
        start = @outbox_lock.synchronize do
          @outbox << [callable, args]
          !@draining && (@draining = true)
        end
        @executor.post { drain } if start
      end

      def drain
        loop do
          calls = @outbox_lock.synchronize do
            @draining = false if @outbox.empty?
            @outbox.shift(@outbox.size)
          end
          return if calls.empty?
          calls.each do |callable, args|
            callable.call(*args)
          rescue => e
            Herald.logger.warn "ActionCable (adapter: herald): a subscriber's callback failed: #{e.class}: #{e.message}"
          end
        end
      ensure
        # Killed mid-way (the executor shut down): the next call_later starts a drain again.
        @outbox_lock.synchronize { @draining = false } if $!
      end

      def failed(error, failures, doing)
        wait = BACKOFF[[failures, BACKOFF.size - 1].min]
        Herald.logger.warn "ActionCable (adapter: herald): #{doing} failed: #{error.class}: #{error.message}; " \
          "trying again in #{wait} s"
        sleep wait unless @stopped
        failures + 1
      end

      def recovered(failures, doing)
        Herald.logger.info "ActionCable (adapter: herald): #{doing} again after #{failures} failure(s)" if failures > 0
        0
      end
    end
  end
end
