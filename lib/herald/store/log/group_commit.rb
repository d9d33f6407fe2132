# frozen_string_literal: true

module Herald
  module Store
    class Log
      # fsync: :always with group commit. Appenders queue their records; one of them (the leader) takes the
      # whole queue, writes it with one write under one lock and one fdatasync, and hands every appender
      # its message. While the leader waits for the disk the next batch queues up, so N concurrent
      # appenders share fsyncs instead of paying one each. One thread alone leads every batch of one.
      # (:interval and :never write straight away under the store's lock: Log#append.)
      module GroupCommit
        # Each waiting appender sleeps on its own condition variable: a finished batch wakes its own
        # appenders, not every thread in the queue (a broadcast woke them all, to find most not done).
        # key and retention: the record's index key and the retention it carries, set while it is staged.
        Pending = Struct.new(:request, :message, :error, :done, :cond, :key, :retention)
        GATHER = 0.0005
        INTERRUPTED = StoreError.new("the thread writing this record's batch failed: the record may or may not be stored")
        DEFER_INTERRUPTS = {Object => :never}.freeze

        private

        def start_group_commit
          @commit_mutex = Mutex.new
          @gather_target = nil # while a leader gathers: the queue size it waits for
          @appenders = 1 # appenders seen in the last batch's cycle: the next gather waits for as many
          @sync_took = GATHER # how long the last batch's fdatasync took
          @commit_queue = []
          @to_wake = [] # appenders whose batch is done, not yet woken (pass_on)
          @committing = false
          @staged = 0
          @batch_buffer = String.new(capacity: 64 * 1024, encoding: Encoding::BINARY)
          @batch_counts = Hash.new(0) # records of each channel staged so far in the batch being written
        end

        # request: [channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_size, max_age]
        def commit_grouped(request)
          # One condition variable per thread, kept: a thread waits for one record at a time. A stale signal
          # (the chain reaching a record whose thread had left, see pass_on) can only wake it spuriously.
          cond = (Thread.current[:herald_commit_cond] ||= ConditionVariable.new)
          pending = Pending.new(request, nil, nil, false, cond)
          @commit_mutex.synchronize do
            @commit_queue << pending
            until pending.done
              if !@committing
                lead_commit(pending)
              elsif @gather_target && @commit_queue.size >= @gather_target
                take_over
              else
                pending.cond.wait(@commit_mutex)
              end
            end
          ensure
            pass_on(pending)
          end
          raise pending.error if pending.error
          pending.message
        end

        # A finished batch's appenders are woken one at a time, each by the one before as it leaves (the
        # leader first): a woken thread needs the GVL, and the one leaving gives it up within a few
        # microseconds, as it publishes again and sleeps or goes on to block elsewhere. Woken all at once,
        # they found the GVL taken and slept a second time on Ruby's GVL queue, to be woken again one by
        # one: two sleeps and two wakeups each, serialized anyway. A thread leaving by an exception (killed
        # while it waited) passes on too, so nobody is left asleep with its record done.
        def pass_on(pending)
          pending.cond = nil # nobody waits on it now: skipped when its turn comes (a killed appender's)
          @to_wake.delete(pending)
          while (next_one = @to_wake.shift)
            next unless next_one.cond
            next_one.cond.signal
            break
          end
          @commit_queue.find(&:cond)&.cond&.signal unless @committing # this thread was to lead, and is leaving
        end

        # Runs with @commit_mutex held; writes and syncs without it so the next batch can queue.
        def lead_commit(pending)
          @committing = true
          gathered = nil
          gathered = gather(pending)
          commit_queued if gathered
        ensure
          @committing = false if gathered.nil? # killed while gathering: the next appender leads (pass_on wakes it)
        end

        # The appender that completes the count a gathering leader waits for commits the batch itself: it
        # holds the GVL already, where waking the leader cost a wakeup and a GVL hand-off (~20 us on this
        # VM) between the last arrival and the write. The leader is not woken: it sleeps on its own
        # condition variable until its deadline or its batch is done (pass_on), whichever comes first, and
        # then waits for its record like any appender.
        def take_over
          @gather_target = nil
          commit_queued
        end

        # Writes and syncs the queue without @commit_mutex, so that the next batch can queue meanwhile. A
        # Thread#kill or Thread#raise (Timeout.timeout, rack-timeout) aimed at this thread takes effect once
        # the batch is committed and handed out: taking effect half way, it failed every appender of the
        # batch with "may or may not be stored" (the fdatasync itself cannot be cut short anyway).
        def commit_queued
          batch = @commit_queue
          @commit_queue = []
          Thread.handle_interrupt(DEFER_INTERRUPTS) do
            @commit_mutex.unlock
            error = INTERRUPTED # until commit returns (it returns StandardErrors; others pass through)
            begin
              error = commit(batch)
            ensure
              @commit_mutex.lock
              hand_out(batch, error)
            end
          end
        end

        def hand_out(batch, error)
          batch.each do |p|
            p.error = error
            p.done = true
          end
          @to_wake.concat(batch) # woken in turn as each leaves commit_grouped (pass_on), this leader first
          # The batch's appenders come back with their next records, and those queued meanwhile are waiting:
          # the next batch waits for all of them (the last batch's size alone, once a batch was split by a
          # straggler, kept the two halves apart for good).
          @appenders = batch.size + @commit_queue.size
          @committing = false
          # The next batch's leader: whoever queues next, else the head of the queue (woken here).
          @commit_queue.find(&:cond)&.cond&.signal
        end

        # When the last batch was shared, waits for as many appenders as it had: the ones it released are on
        # their way back with their next record. The appender that completes the count commits the batch
        # itself (take_over): false then. It waits at most half the last fdatasync (and GATHER): whoever is
        # not back by then comes back during the next sync and joins the batch after, so a long wait only
        # stretched the time between syncs (docs/log.md). True: this leader commits what is queued.
        def gather(pending)
          return true if @appenders <= 1 || @commit_queue.size >= @appenders
          @gather_target = @appenders
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + [GATHER, @sync_took / 2].min
          while @gather_target
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            if left <= 0
              @gather_target = nil
              return true
            end
            pending.cond.wait(@commit_mutex, left)
          end
          false
        ensure
          @gather_target = nil
        end

        # Returns nil, or the error every appender of the batch raises.
        def commit(batch)
          segment = @lock.synchronize do
            writable!
            written = locked { write_batch(batch) }
            # While other processes write too, the lease goes before the sync, not after: another process's
            # batch is written while this one syncs, and the kernel's next journal commit serves both
            # processes' fdatasync calls (group commit across processes). Kept over the sync, every process
            # synced alone, in turn. Taking it again costs a flock or two per batch, against the sync's
            # hundreds of microseconds; a process writing alone keeps it (no flock per publish).
            drop_lease if contended?
            written
          end
          @watchers.call # readers see the records now, as the lock is released (before the sync, as waiters)
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          @syncer.sync_now(segment)
          @sync_took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
          @wakeup&.notify
          nil
        rescue => e
          e
        end

        # Stages every record (ids follow on from the log and from each other), writes them at once, and
        # indexes them only once the write succeeded.
        def write_batch(batch)
          prepare_append
          reserve(@index.last_global_id + batch.size)
          @batch_buffer.clear
          counts = @batch_counts.clear
          batch.each do |p|
            channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_size, max_age = p.request
            key = p.key = site_id ? Store.channel_key(channel, site_id) : channel
            ch = @index.channel(key)
            retention = p.retention = retention_for(ch, max_size, max_age)
            p.message = stage(@buffer, ch, counts[key], retention, channel, payload, codec, created_at,
              user_ids, group_ids, client_ids, site_id)
            counts[key] += 1
            @staged += 1
            @batch_buffer << @buffer
          end
          storing { @segments.last.write(@batch_buffer) }
          @syncer.written
          batch.each { |p| @index.add(p.message, p.key, p.retention) }
          @appended.broadcast if @waiting > 0
          @segments.last
        ensure
          @staged = 0
        end
      end
    end
  end
end
