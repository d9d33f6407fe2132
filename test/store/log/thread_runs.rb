# frozen_string_literal: true

# For tests that start several threads of one process on a store at once and count what they cost each
# other. The including class defines THREADS.
module LogThreadRuns
  private

  # Runs the block per_thread times in each of THREADS threads, all let go together; returns each thread's
  # voluntary context switches over its loop (its own, from /proc/thread-self).
  def run_threads(per_thread)
    count = self.class::THREADS
    start = Queue.new
    threads = Array.new(count) do |t|
      Thread.new do
        start.pop
        before = voluntary_switches
        per_thread.times { |i| yield t, i }
        voluntary_switches - before
      end
    end
    sleep 0.05 # every thread waits at the queue
    count.times { start << true }
    threads.map(&:value)
  end

  def voluntary_switches
    File.read("/proc/thread-self/status")[/^voluntary_ctxt_switches:\s+(\d+)/, 1].to_i
  end
end
