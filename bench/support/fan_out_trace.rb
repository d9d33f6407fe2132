# frozen_string_literal: true

require "json"

module Bench
  # Server-side timing of Herald's fan-out (Herald::Rack::Reactor#trace), for bench/http_latency_bench.rb.
  # The publish route stamps the server's wall clock into the message ("st", see test/support/http_server.rb);
  # the reactor calls #wrote after each shared reply it hands the kernel, and once the bookkeeping is done
  # the recorder writes one JSON file, DIR/fan-out-PID-N.json (whole, by a rename: the bench reads them while
  # the servers write), with the stamp and every write's time. Clocks
  # are CLOCK_REALTIME, so a worker process that did not take the publish request measures from the same stamp.
  # Beside the clocks: the loop thread's time waiting for a CPU while runnable (the kernel's schedstat: the
  # machine's other work, not Herald's) and the GCs that ran, from the start to the last write: what makes one
  # round slower than another.
  class FanOutTrace
    def initialize(dir)
      @dir = dir
      @count = 0
    end

    def start(msg) = Recorder.new(msg, File.join(@dir, "fan-out-#{Process.pid}-#{@count += 1}.json"))

    class Recorder
      def initialize(msg, path)
        @msg = msg
        @path = path
        @writes = []
        @cpu = [cpu]
        @objects = [GC.stat(:total_allocated_objects)]
        @waited = [waited]
        @gcs = [GC.count]
        @started = now
      end

      def wrote = @writes << now

      def written(count)
        @last = now
        @count = count
        @cpu << cpu
        @objects << GC.stat(:total_allocated_objects)
        @waited << waited
        @gcs << GC.count
      end

      # Everything below runs after the fan-out, so it is not part of the figures.
      def done
        finished = now
        @cpu << cpu
        @objects << GC.stat(:total_allocated_objects)
        data = @msg.data
        stamp = (data["st"] || data["t"] if data.is_a?(Hash)) or return # "t" alone: published elsewhere (herald publish)
        line = JSON.generate("pid" => Process.pid, "global_id" => @msg.global_id, "st" => stamp,
          "started" => @started, "last_write" => @last, "done" => finished, "writes" => @writes,
          "answered" => @count, "cpu" => @cpu, "objects" => @objects, "waited" => @waited, "gcs" => @gcs)
        File.write("#{@path}.tmp", line)
        File.rename("#{@path}.tmp", @path)
      end

      def now = Process.clock_gettime(Process::CLOCK_REALTIME)

      # The reactor thread's own CPU time: what the fan-out costs whatever else runs on the machine.
      def cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)

      # Seconds this thread has spent runnable but waiting for a CPU (/proc/thread-self/schedstat, second
      # field; opened once per thread: a pread is ~4 us). nil where there is no such file.
      def waited
        file = (Thread.current[:bench_schedstat] ||= File.open("/proc/thread-self/schedstat"))
        file.pread(64, 0).split[1].to_i / 1e9
      rescue SystemCallError, IOError
        nil
      end
    end

    # Every recorded fan-out in dir, {global_id => [records of each process]}; the files are deleted.
    def self.collect(dir)
      Dir[File.join(dir, "fan-out-*.json")].map do |path|
        JSON.parse(File.read(path)).tap { File.delete(path) }
      end.group_by { |r| r["global_id"] }
    end
  end
end
