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
        Pending = Struct.new(:request, :message, :error, :done, :cond)
        GATHER = 0.0005
        INTERRUPTED = StoreError.new("the thread writing this record's batch was killed: the record may or may not be stored")

        private

        def start_group_commit
          @commit_mutex = Mutex.new
          @gathered = ConditionVariable.new
          @gather_target = nil # while a leader gathers: the queue size it waits for
          @last_batch = 1
          @sync_took = GATHER # how long the last batch's fdatasync took
          @commit_queue = []
          @committing = false
          @staged = 0
          @batch_buffer = String.new(capacity: 64 * 1024, encoding: Encoding::BINARY)
        end

        # request: [channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_size, max_age]
        def commit_grouped(request)
          pending = Pending.new(request, nil, nil, false, ConditionVariable.new)
          @commit_mutex.synchronize do
            @commit_queue << pending
            @gathered.signal if @gather_target && @commit_queue.size >= @gather_target
            until pending.done
              @committing ? pending.cond.wait(@commit_mutex) : lead_commit
            end
          end
          raise pending.error if pending.error
          pending.message
        end

        # Runs with @commit_mutex held; writes and syncs without it so the next batch can queue.
        def lead_commit
          @committing = true
          gather
          batch = @commit_queue
          @last_batch = batch.size
          @commit_queue = []
          @commit_mutex.unlock
          error = INTERRUPTED # until commit returns
          begin
            error = commit(batch)
          ensure
            @commit_mutex.lock
            batch.each do |p|
              p.error = error
              p.done = true
              p.cond.signal
            end
            @committing = false
            # The next batch's leader: whoever queues next, else the head of the queue (woken here).
            @commit_queue.first&.cond&.signal
          end
        end

        # When the last batch was shared, waits for as many appenders as it had: the ones it released are on
        # their way back with their next record. The appender that completes the count wakes it: one wakeup a
        # batch (each arrival woke it before, and it had to take the GVL to count again). It waits at most
        # half the last fdatasync (and GATHER): whoever is not back by then comes back during the next sync
        # and joins the batch after, so a long wait only stretched the time between syncs (docs/log.md).
        def gather
          return if @last_batch <= 1 || @commit_queue.size >= @last_batch
          @gather_target = @last_batch
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + [GATHER, @sync_took / 2].min
          while @commit_queue.size < @gather_target
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0
            @gathered.wait(@commit_mutex, left)
          end
        ensure
          @gather_target = nil
        end

        # Returns nil, or the error every appender of the batch raises.
        def commit(batch)
          segment = @lock.synchronize do
            writable!
            locked { write_batch(batch) }
          end
          @watchers.call # readers see the records now, as the lock is released (before the sync, as waiters)
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          @syncer.sync_now(segment)
          @sync_took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
          @wakeup.notify
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
          counts = Hash.new(0)
          staged = batch.map do |p|
            channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_size, max_age = p.request
            key = site_id ? Store.channel_key(channel, site_id) : channel
            ch = @index.channel(key)
            retention = retention_for(ch, max_size, max_age)
            p.message = stage(@buffer, ch, counts[key], retention, channel, payload, codec, created_at,
              user_ids, group_ids, client_ids, site_id)
            counts[key] += 1
            @staged += 1
            @batch_buffer << @buffer
            [p.message, key, retention]
          end
          storing { @segments.last.write(@batch_buffer) }
          @syncer.written
          staged.each { |msg, key, retention| @index.add(msg, key, retention) }
          @appended.broadcast
          @segments.last
        ensure
          @staged = 0
        end
      end
    end
  end
end
