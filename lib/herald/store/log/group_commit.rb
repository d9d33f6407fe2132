# frozen_string_literal: true

module Herald
  module Store
    class Log
      # Every append goes through here. Appenders queue their records; one of them (the leader) takes the
      # whole queue, writes it with one write under one lock (and, with fsync :always, one fdatasync), and
      # hands every appender its message. While the leader writes (or waits for the disk) the next batch
      # queues up, so N concurrent appenders share writes and fsyncs instead of paying one each (and make
      # no syscalls of their own, nor hand Ruby's GVL around once per record). One thread alone leads
      # every batch of one, and waits for nobody.
      module GroupCommit
        # Each waiting appender sleeps on its own condition variable: a finished batch wakes its own
        # appenders, not every thread in the queue (a broadcast woke them all, to find most not done).
        Pending = Struct.new(:request, :message, :error, :done, :cond)
        GATHER = 0.0005

        private

        def start_group_commit
          @commit_mutex = Mutex.new
          @gathered = ConditionVariable.new
          @last_batch = 1
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
            @gathered.signal
            until pending.done
              @committing ? pending.cond.wait(@commit_mutex) : lead_commit
            end
            # Keep committing what queued meanwhile: the appenders just released need the GVL to come back,
            # and a leader already running starts the next batch sooner than a woken one would.
            lead_commit while !@committing && !@commit_queue.empty?
          end
          raise pending.error if pending.error
          pending.message
        end

        # After an append written straight away (Log#append), with @commit_mutex held: what queued
        # meanwhile is written now, by this thread, which is running already.
        def end_direct_commit
          @committing = false
          lead_commit while !@committing && !@commit_queue.empty?
        end

        # Runs with @commit_mutex held; writes and syncs without it so the next batch can queue.
        def lead_commit
          @committing = true
          gather
          batch = @commit_queue
          @last_batch = batch.size
          @commit_queue = []
          @commit_mutex.unlock
          begin
            commit(batch)
          rescue => e
            batch.each { |p| p.error = e }
          ensure
            @commit_mutex.lock
            batch.each do |p|
              p.done = true
              p.cond.signal
            end
            @committing = false
            # The thread finishing a batch leads the next itself; should it not (it raised), the head of
            # the queue is woken to lead.
            @commit_queue.first&.cond&.signal
          end
        end

        # When the last batch was shared, waits (at most GATHER) for as many appenders as it had: the ones
        # it released are on their way back with their next record. Only for fsync :always: an fsync is
        # worth waiting for, a write is not.
        def gather
          return if @last_batch <= 1 || @fsync != :always
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + GATHER
          while @commit_queue.size < @last_batch
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0
            @gathered.wait(@commit_mutex, left)
          end
        end

        def commit(batch)
          segment = @lock.synchronize do
            writable!
            locked { write_batch(batch) }
          end
          @syncer.sync_now(segment) if @fsync == :always
          @wakeup.notify
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
