# frozen_string_literal: true

module Herald
  module Store
    class Redis
      # Groups the concurrent publishes of one process into one script call, as the Log's group commit
      # does with writes. A publisher queues its request; when no call is running it leads: takes up to MAX
      # queued requests, runs them in one round trip (`run` gets the requests and returns one result for
      # each) and hands every publisher of the batch its result. One thread alone runs its request
      # straight away, without queueing.
      #
      # Why one call at a time, and the gathering: under the GVL a round trip's cost on the client is
      # mostly thread switches (each release of the GVL while another thread wants it is two, and the
      # Redis driver releases it three or four times per call), not bytes. With two calls in flight and 4
      # threads, most batches held one record (1.4 on average, 0.7 calls per publish) and every call's I/O
      # raced the other threads for the GVL. So a leader whose last batch was shared first passes the GVL
      # to the publishers it just released (they are preparing their next record) until as many have
      # queued as last time, for at most GATHER seconds; its call then runs while every other publisher
      # sleeps (no GVL contention during the I/O), and 4 threads share one call per 4 publishes. Once
      # batches stop being shared, the next leader gathers once (up to GATHER) and publishes go alone again.
      class Batcher
        # Each waiting publisher sleeps on its own condition variable: a finished batch wakes its own
        # publishers and the next leader, not every thread in the queue.
        Pending = Struct.new(:request, :result, :error, :done, :cond)
        MAX = 64 # records per script call: bounds how long one call holds the server
        GATHER = 0.0002 # seconds a leader waits for the publishers of its last batch to queue again

        def initialize(&run)
          @run = run
          @mutex = Mutex.new
          @queue = []
          @running = false
          @last_batch = 1
        end

        def call(request)
          @mutex.lock
          return call_alone(request) if !@running && @last_batch <= 1 && @queue.empty?
          pending = Pending.new(request, nil, nil, false, ConditionVariable.new)
          begin
            @queue << pending
            until pending.done
              (!@running && !@queue.empty?) ? lead : pending.cond.wait(@mutex)
            end
          ensure
            leave(pending) unless pending.done # killed or interrupted while queued (Thread#kill, Timeout)
            @mutex.unlock
          end
          raise pending.error if pending.error
          pending.result
        end

        private

        # Nothing queued, no call running and no batch shared lately (called with @mutex held, returns
        # with it released): no Pending, no waiting.
        def call_alone(request)
          @running = true
          @mutex.unlock
          begin
            @run.call([request]).first
          ensure
            @mutex.synchronize do
              @running = false
              @queue.first&.cond&.signal # queued meanwhile: the head leads
            end
          end
        end

        # Runs with @mutex held; makes the call without it so the next batch can queue.
        def lead
          @running = true
          batch = gather
          @mutex.unlock
          begin
            results = @run.call(batch.map(&:request))
            batch.each_with_index { |p, i| p.result = results[i] }
          rescue Exception => e # standard:disable Lint/RescueException
            batch.each { |p| p.error = e } # a killed leader must not leave the others a nil result
            raise unless e.is_a?(StandardError)
          ensure
            @mutex.lock
            batch.each do |p|
              p.done = true
              p.cond.signal
            end
            @running = false
            @queue.first&.cond&.signal
          end
        end

        # Interrupted while queued: the caller was told the publish did not happen, so its request is not
        # sent. It may be the head, woken to lead (a wake-up nobody else would get): the next one is.
        def leave(pending)
          @queue.delete(pending)
          @queue.first&.cond&.signal unless @running
        end

        # Takes the batch (with @mutex held), after letting the publishers of the last one queue again.
        # Thread.pass hands the GVL to a thread that wants it and returns at once when none does.
        def gather
          if @queue.size < @last_batch
            deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + GATHER
            @mutex.unlock
            begin
              Thread.pass while @queue.size < @last_batch && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
            ensure
              @mutex.lock
            end
          end
          batch = (@queue.size > MAX) ? @queue.shift(MAX) : @queue
          @queue = [] if batch.equal?(@queue)
          @last_batch = batch.size
          batch
        rescue Exception # standard:disable Lint/RescueException
          @running = false # killed while gathering: another publisher leads
          @queue.first&.cond&.signal
          raise
        end
      end
    end
  end
end
