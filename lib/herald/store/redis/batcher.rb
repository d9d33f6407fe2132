# frozen_string_literal: true

module Herald
  module Store
    class Redis
      # Groups the concurrent publishes of one process into one script call, as the Log's group commit
      # does with writes. A publisher queues its request; when no call is running and the publishers of the
      # last batch are back (or nobody has queued for GATHER), the publisher that queued last leads: takes
      # up to MAX queued requests, runs them in one round trip (`run` gets the requests and returns one
      # result for each) and hands every publisher of the batch its result. One thread alone runs its
      # request straight away, without queueing.
      #
      # Why one call at a time: under the GVL a round trip's cost on the client is mostly thread hand-offs
      # (on a 2-core VM one costs ~17 us of CPU and 20-45 us of wall time, more than a publish's own Ruby),
      # not bytes. With two calls in flight and 4 threads, most batches held one record and every call's
      # I/O raced the other threads for the GVL; with a call for each thread (up to 4 in flight) 8 threads
      # ran 1.3-1.4x message_bus against 1.9-2.1x with one shared call. With one, 4 threads share one call
      # per 4 publishes.
      #
      # How a batch's publishers are woken: a thread woken while another holds the GVL blocks again, on
      # the GVL, and must be woken a second time when it is released. The leader used to wake every
      # publisher of its batch at once (each woken thread preempted the leader, found the GVL taken and
      # went back to sleep: 37 us before the leader itself returned) and then spin handing the GVL over
      # until they had queued again: 2.9-3.0 voluntary and 1.7-2.7 involuntary switches a publish at 4
      # threads. Now the leader wakes only the first and returns; each publisher, as it wakes, wakes the
      # next (whose wake-up latency overlaps its own Ruby), and the last one back finds everybody queued
      # and leads (@away counts who is still to come back). Nobody spins: 1.3-1.4 + 0.7-0.8 switches a
      # publish. (Waking each only when the one before went to sleep again cost one switch a publish but
      # put every wake-up latency end to end: slower.)
      # A publisher that does not come back, or is killed before waking the next, would leave the rest
      # waiting, so every wait is timed (`patience`: GATHER plus twice the last call's time, at most
      # PATIENCE_MAX): a publisher whose batch has run wakes on its own by then, and one that finds the
      # queue idle for GATHER leads. Batches then shrink to who is left, and a thread alone calls
      # straight away again.
      class Batcher
        # Each waiting publisher sleeps on its own condition variable. `after` is the next publisher of
        # the same batch to wake; `out` marks one that stopped waiting (returned, killed); `led` one whose
        # thread made the call (it wakes the first of the others).
        Pending = Struct.new(:request, :result, :error, :done, :cond, :after, :out, :led)
        MAX = 64 # records per script call: bounds how long one call holds the server
        GATHER = 0.0002 # seconds the queue waits, once nobody joins it, for the rest of the last batch
        PATIENCE_MAX = 0.01 # longest sleep between checks (a stalled call can last `timeout:`)

        def initialize(&run)
          @run = run
          @mutex = Mutex.new
          @queue = []
          @running = false
          @expect = 1 # the last batch's size
          @away = 0 # publishers handed a result since the last call began who have not queued again
          @joined = 0.0 # when the last publisher queued
          @took = GATHER # how long the last call took
          @baton = nil # the next publisher of a finished batch to wake
        end

        def call(request)
          @mutex.lock
          return call_alone(request) if !@running && @expect <= 1 && @away <= 1 && @queue.empty? && asleep.nil?
          pending = Pending.new(request, nil, nil, false, ConditionVariable.new, nil, false, false)
          begin
            @queue << pending
            @joined = now
            @away -= 1 if @away > 0
            wait_for(pending)
          ensure
            pending.out = true
            if pending.done
              pass_baton unless pending.led # wake the next of the batch while this one gets going
            else
              @queue.delete(pending) # killed or interrupted while queued (Thread#kill, Timeout): not sent
            end
            @mutex.unlock
          end
          raise pending.error if pending.error
          pending.result
        end

        private

        # With @mutex held, until the request's batch has run.
        def wait_for(pending)
          until pending.done
            if !@running && (@away == 0 || now - @joined >= GATHER)
              lead(pending)
            else
              pending.cond.wait(@mutex, patience)
            end
          end
        end

        def patience = [GATHER + 2 * @took, PATIENCE_MAX].min

        # Wakes the next publisher of a finished batch still asleep.
        def pass_baton
          baton = asleep
          @baton = baton&.after
          baton&.cond&.signal
        end

        # The next publisher of a finished batch still waiting for its wake-up, if any.
        def asleep
          @baton = @baton.after while @baton&.out
          @baton
        end

        # Nothing queued, no call running and no batch shared lately (called with @mutex held, returns
        # with it released): no Pending, no waiting.
        def call_alone(request)
          @running = true
          @away = 0
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

        # Runs with @mutex held; makes the call without it so the next publishers can queue. `own` is the
        # leader's request (in the batch unless more than MAX were queued before it).
        def lead(own)
          batch = (@queue.size > MAX) ? @queue.shift(MAX) : @queue
          @queue = [] if batch.equal?(@queue)
          @running = true
          @expect = batch.size
          @away = 0 # whoever is not back by now is not waited for
          own.led = batch.include?(own)
          started = now
          @mutex.unlock
          answered = false
          begin
            results = @run.call(batch.map(&:request))
            batch.each_with_index { |p, i| p.result = results[i] }
            answered = true
          rescue Exception => e # standard:disable Lint/RescueException
            batch.each { |p| p.error = e } # a leader interrupted by an exception must not leave the others a nil result
            answered = true
            raise unless e.is_a?(StandardError)
          ensure
            # Thread#kill unwinds through ensure only (no rescue runs): the call may or may not have run.
            batch.each { |p| p.error = interrupted } unless answered
            @mutex.lock
            @took = now - started
            finish(batch, own)
          end
        end

        # The batch has run (with @mutex held). Its other publishers are chained behind any still asleep
        # from the batch before, and the first one still asleep is woken.
        def finish(batch, own)
          followers = batch.reject { |p| p.equal?(own) }
          batch.each { |p| p.done = true }
          followers.each_cons(2) { |a, b| a.after = b }
          if (last = asleep)
            last = last.after while last.after
            last.after = followers.first
          else
            @baton = followers.first
          end
          @away += batch.size
          @running = false
          pass_baton
        end

        def interrupted
          ConnectionError.new("the thread making this publish's script call (shared with other publishes) was killed mid-call: it may or may not have been stored")
        end

        def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
