# frozen_string_literal: true

module Herald
  module Store
    class Redis
      # Groups the concurrent publishes of one process into one script call, as the Log's group commit
      # does with fsyncs. A publisher queues its request; when fewer than LEADERS calls are running it
      # leads: takes up to MAX queued requests, runs them in one round trip (`run` gets the requests and
      # returns one result for each) and hands every publisher its result. While calls are on the wire
      # the next batch queues up, so N threads share round trips and script runs instead of paying one
      # each. One thread alone runs its request straight away, without queueing.
      class Batcher
        Pending = Struct.new(:request, :result, :error, :done)
        MAX = 64 # records per script call: bounds how long one call holds the server
        LEADERS = 2 # calls on the wire at once: one is being answered while the next is sent

        def initialize(&run)
          @run = run
          @mutex = Mutex.new
          @done = ConditionVariable.new
          @queue = []
          @running = 0
        end

        def call(request)
          @mutex.lock
          return call_alone(request) if @queue.empty? && @running < LEADERS
          pending = Pending.new(request)
          begin
            @queue << pending
            until pending.done
              (@running < LEADERS && !@queue.empty?) ? lead : @done.wait(@mutex)
            end
          ensure
            @mutex.unlock
          end
          raise pending.error if pending.error
          pending.result
        end

        private

        # Nothing queued and a call free (called with @mutex held, returns with it released): no Pending.
        def call_alone(request)
          @running += 1
          @mutex.unlock
          begin
            @run.call([request]).first
          ensure
            @mutex.synchronize do
              @running -= 1
              @done.broadcast unless @queue.empty?
            end
          end
        end

        # Runs with @mutex held; makes the call without it so the next batch can queue.
        def lead
          @running += 1
          batch = (@queue.size > MAX) ? @queue.shift(MAX) : @queue
          @queue = [] if batch.equal?(@queue)
          @mutex.unlock
          begin
            results = @run.call(batch.map(&:request))
            batch.each_with_index { |p, i| p.result = results[i] }
          rescue Exception => e # standard:disable Lint/RescueException
            batch.each { |p| p.error = e } # a killed leader must not leave the others a nil result
            raise unless e.is_a?(StandardError)
          ensure
            @mutex.lock
            batch.each { |p| p.done = true }
            @running -= 1
            @done.broadcast
          end
        end
      end
    end
  end
end
