# frozen_string_literal: true

module Herald
  module Store
    class Redis
      # Groups the concurrent publishes of one process into one script call, as the Log's group commit
      # does with fsyncs. A publisher queues its request; when no call is running it leads: takes up to
      # MAX queued requests, runs them in one round trip (`run` gets the requests and returns one result
      # for each) and hands every publisher its result. While the call is on the wire the next batch
      # queues up, so N threads share round trips and script runs instead of paying one each. One thread
      # alone leads every time and waits for nobody.
      class Batcher
        Pending = Struct.new(:request, :result, :error, :done)
        MAX = 64 # records per script call: bounds how long one call holds the server

        def initialize(&run)
          @run = run
          @mutex = Mutex.new
          @done = ConditionVariable.new
          @queue = []
          @running = false
        end

        def call(request)
          pending = Pending.new(request)
          @mutex.synchronize do
            @queue << pending
            until pending.done
              @running ? @done.wait(@mutex) : lead
            end
          end
          raise pending.error if pending.error
          pending.result
        end

        private

        # Runs with @mutex held; makes the call without it so the next batch can queue.
        def lead
          @running = true
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
            @running = false
            @done.broadcast
          end
        end
      end
    end
  end
end
