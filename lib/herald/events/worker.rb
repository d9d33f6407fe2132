# frozen_string_literal: true

module Herald
  module Events
    # One deferred subscriber in this process: a reader of the whole log with a durable cursor (the last
    # global id it is done with), saved through the store's save_cursor.
    #
    # Only the process holding the subscriber's lease reads (store.lease: an flock for the Log store, so the
    # kernel frees it when the owner dies); the others try again every LEASE_RETRY seconds and, once they
    # get it, resume after the saved cursor. That is what makes "once per subscriber across processes".
    #
    # Throughput: it reads BATCH messages per store call, compares channel strings before decoding
    # anything (the verdict is cached per channel) and decodes only matching messages. It saves the
    # cursor about every SAVE_EVERY seconds while busy: the clock is read after every handled event (a
    # slow handler is followed by a save once SAVE_EVERY has passed, so a kill -9 repeats about one
    # event) and every CHECK_EVERY skipped ones; and exactly when idle or stopping.
    #
    # A damaged cursor (CorruptCursorError) stops the subscriber: `error` holds why, it lets go of its
    # lease and never reads again in this process. Starting over from cursor 0 would run every retained
    # event again.
    #
    # A subscriber with no saved cursor starts after the store's last global id as it was when this
    # Worker was built (the pool starts before the publish that starts it: that event is handled), or at
    # 0 with `deferred start: :oldest`; the cursor is saved at once, so a restart resumes there.
    class Worker
      BATCH = 1000
      SAVE_EVERY = 0.05
      CHECK_EVERY = 32
      LEASE_RETRY = 0.5
      MATCH_CACHE_LIMIT = 10_000
      PAUSE_CHECK = 0.2 # seconds between two looks at the store's pause flag (Store::Controls)
      REQUEST_CHECK = 1.0 # seconds between two looks for dead-letter retries asked by an operator (two reads)

      attr_reader :subscriber, :name, :cursor, :error

      def initialize(subscriber, store:, stopper:, now: nil)
        @subscriber = subscriber
        @name = subscriber.subscriber_name
        @store = store
        @stopper = stopper
        @dead_letters = DeadLetters.new(store)
        @delivery = Delivery.new(subscriber, subscriber.new, dead_letters: @dead_letters, stopper: stopper,
          controls: store)
        @channels = subscriber.herald_targets.grep(String).freeze
        @classes = subscriber.herald_targets.grep(Module).freeze
        @match = {}
        @lease = nil
        @epoch = nil # the store's epoch the lease and cursor belong to
        @next_lease_try = 0.0
        @start = (subscriber.herald_start == :oldest) ? 0 : now || store.last_global_id
        @cursor = 0
        @saved = 0
        @saved_at = 0.0
        @error = nil
        @paused = false
        @pause_checked_at = -PAUSE_CHECK
      end

      # Processes one batch. Returns how many messages it read (0: nothing to do, the pool may wait).
      def step
        restart if @lease && @store.known_epoch != @epoch
        return 0 if paused?
        return 0 unless owner?
        serve_retry_requests
        batch = @store.global_backlog(@cursor, limit: BATCH)
        return 0 if @store.known_epoch != @epoch # found a reset (Redis: records of a new epoch): the next step restarts
        if batch.empty?
          save_cursor if @cursor != @saved
          return 0
        end
        process(batch)
        save_cursor if monotonic - @saved_at >= SAVE_EVERY
        batch.size
      end

      # Saves the exact cursor and lets another process take over. Called once the thread has stopped.
      def finish
        return unless @lease
        save_cursor if @cursor != @saved
      ensure
        release
      end

      # Its thread died, or a handler is stopping the process: the exact cursor is saved and the lease let
      # go, so a standby process takes over at once; this one tries again only after `cool_off` seconds.
      def hand_over(cool_off: 0)
        finish
      ensure
        @next_lease_try = monotonic + cool_off
      end

      # In a forked child: the parent's lease is the parent's; drop this copy without saving anything.
      def forget_after_fork = release

      def owner? = !@lease.nil? || acquire

      # Dead-letter retries an operator asked for (DeadLetters#request_retry), looked for every REQUEST_CHECK:
      # the request cursor is saved after they ran, so a crash runs them again, and DeadLetters skips the
      # letters already resolved.
      def serve_retry_requests
        now = monotonic
        return if now - (@requests_checked_at ||= -REQUEST_CHECK) < REQUEST_CHECK
        @requests_checked_at = now
        key = Store::Controls::REQUESTS + @name
        served = @store.load_cursor(key, default: 0)
        return if @store.last_id(DeadLetters.request_channel(@name)) <= served
        @store.save_cursor(key, @dead_letters.serve_retry_requests(Events.registry.current(@subscriber), served))
      rescue BusyError
        nil # the dashboard's process is retrying this subscriber's letters itself: next look
      end

      # Paused by an operator (the dashboard, through the store): the cursor is saved and the lease let go,
      # so the cursor may be moved meanwhile and whoever takes the lease on resume reads it afresh.
      def paused?
        now = monotonic
        if now - @pause_checked_at >= PAUSE_CHECK
          @pause_checked_at = now
          @paused = @store.paused?(@name)
        end
        finish if @paused && @lease
        @paused
      end

      # Stops this subscriber for good in this process (its cursor cannot be trusted): nothing is saved.
      def stop!(error)
        @error = error
        release
      end

      private

      # Slow handlers make a batch long: the cursor is saved within it, by time.
      def process(batch)
        skipped = 0
        batch.each do |msg|
          break if @stopper.stopped?
          if match?(msg)
            done = @delivery.deliver(msg)
            break unless done # a shutdown cut its retries short: not done
            @cursor = msg.global_id
            save_cursor if done == :buried # at once: a dead letter is written once (see resume_point)
          else
            @cursor = msg.global_id
            next unless (skipped += 1) % CHECK_EVERY == 0
          end
          save_cursor if monotonic - @saved_at >= SAVE_EVERY
        end
      end

      # The store was reset (a log directory replaced, a flushed Redis): the lease and the cursor belong to
      # what is gone. Let go without saving (the old cursor means nothing in the new epoch); the next step
      # takes the new store's lease and cursor.
      def restart
        Herald.logger.warn "#{@name}: the store was reset (epoch #{@epoch} -> #{@store.known_epoch}): resuming from its saved cursor there"
        release
        @next_lease_try = 0.0
        @start = 0 # "now" was an id of the old store; everything in the new one came after the reset
      end

      def acquire
        now = monotonic
        return false if @error || now < @next_lease_try
        @next_lease_try = now + LEASE_RETRY
        @epoch = @store.known_epoch # before the lease and cursor: a reset after it is seen by the next step
        @cursor_epoch ||= @epoch # the epoch this process first saw: see after_reset
        @start = 0 if @cursor_epoch != @epoch # a standby that saw a reset: a missing cursor went with the old store
        lease = @store.lease(@name) or return false
        begin
          @saved = @store.load_cursor(@name, default: nil) || first_cursor
          @cursor = resume_point(@saved)
        rescue Exception # standard:disable Lint/RescueException
          lease.release # never keep the lease with a cursor that was not read
          raise
        end
        @lease = lease
        true
      end

      # No cursor saved yet: this subscriber is new. Saved now, so a crash before its first event does not
      # move the start to a later "now".
      def first_cursor
        @store.save_cursor(@name, @start)
        @start
      end

      # After the saved cursor, or after the last dead letter when a crash came between burying an event and
      # saving the cursor past it: the events up to it were done with, in order, and are not run (nor
      # buried) again.
      def resume_point(saved) = [after_reset(saved), @dead_letters.last_buried(@name)].max

      # A cursor that survived a reset this process saw (the cursors' table kept beside recreated ones, a
      # restored backup), beyond the new epoch's last id, would skip the new epoch's first events: it is
      # read from its start. Checked by the process that held the lease and by a standby taking over.
      def after_reset(saved)
        return saved if @cursor_epoch == @epoch
        @cursor_epoch = @epoch
        last = @store.last_global_id
        return saved if saved <= last
        Herald.logger.warn "#{@name}: its cursor #{saved} is beyond the reset store's last id #{last}: reading the new epoch from its start"
        0
      end

      def release
        @lease&.release
        @lease = nil
      end

      def save_cursor
        @store.save_cursor(@name, @cursor)
        @saved = @cursor
        @saved_at = monotonic
      end

      def match?(msg)
        channel = msg.channel
        verdict = @match[channel]
        return verdict unless verdict.nil?
        verdict = @channels.include?(channel) || class_match?(msg)
        if !verdict.nil? && (@classes.empty? || channel.start_with?(EVENTS_PREFIX))
          @match.clear if @match.size >= MATCH_CACHE_LIMIT
          @match[channel] = verdict
        end
        verdict
      end

      # Event channels hold one class each, so one decode per channel decides; elsewhere every Event-coded
      # message is looked at.
      def class_match?(msg)
        return false if @classes.empty? || !msg.codec.equal?(Codec::Event)
        klass = msg.data.class
        @classes.any? { |c| klass <= c }
      rescue UnknownEventClassError => e
        Herald.logger.warn "#{@name}: skipping #{msg.channel} ##{msg.global_id}: #{e.message}"
        nil # undecided: not cached, so the channel is looked at again once the class is loaded
      end

      def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
