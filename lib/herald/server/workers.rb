# frozen_string_literal: true

module Herald
  class Server
    # `herald server --workers N`: N server processes on one port (SO_REUSEPORT), so parked clients are
    # spread over N event loops and a publish is written out on every core. Each worker opens the log
    # directory itself and is woken by the log's cross-process wakeups when another worker appends.
    # Threads would not do: IO#write_nonblock keeps the GVL through the write(2), so event-loop threads in
    # one process write one at a time (bench/http_latency_bench.rb, BENCH_HERALD_WORKERS=1,2).
    #
    # max_active_clients counts per worker. The parent only forks, forwards SIGTERM/SIGINT and waits; when a
    # worker exits on its own, the others are stopped and the exit status is 1 (also when a worker fails
    # while stopping: 0 means every worker stopped cleanly).
    class Workers
      def initialize(count, log: $stdout, **options, &on_start)
        raise InvalidArgumentError, "workers must be an Integer >= 1, got #{count.inspect}" unless count.is_a?(Integer) && count >= 1
        @count = count
        @log = log
        @options = options
        @on_start = on_start # called in each worker with its started Server (benchmarks set a trace)
      end

      # Blocks until the workers have stopped; returns the exit status (0: stopped by a signal).
      def run
        reader, writer = IO.pipe
        port = @options.fetch(:port, DEFAULT_PORT)
        @pids = []
        @count.times do |i|
          @pids << fork { worker(i, port, reader, writer) }
          line = reader.gets or return failed_start(i)
          port = Integer(line) # port 0: the first worker picks one, the others join it
        end
        writer.close
        reader.close
        host = @options.fetch(:host, DEFAULT_HOST)
        @log&.puts "Herald listening on http://#{host.include?(":") ? "[#{host}]" : host}:#{port} (#{@count} worker processes: #{@pids.join(", ")})"
        @log&.flush
        supervise
      end

      private

      def worker(index, port, reader, writer)
        reader.close
        server = Server.new(**@options, port: port, reuse_port: true, log: nil) # the parent says when all listen
        server.start
        @on_start&.call(server)
        writer.puts(server.port)
        writer.close
        server.wait
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- a worker reports why it died, then exits
        Herald.logger.error "herald worker #{index}: #{e.class}: #{e.message}"
        exit!(1)
      end

      # A worker that could not start (the port in use, a bad option) said why through Herald.logger.
      def failed_start(index)
        forward("TERM")
        @pids.each { |pid| Process.wait(pid) }
        raise ConfigurationError, "herald worker #{index} did not start (see the log above)"
      end

      def supervise
        stopping = false
        previous = %w[TERM INT].to_h do |sig|
          handler = trap(sig) do
            stopping = true
            forward(sig)
          end
          [sig, handler]
        end
        status = 0
        until @pids.empty?
          pid, result = Process.wait2
          @pids.delete(pid)
          status = 1 unless result.success? # a worker that failed to stop cleanly (its store maybe unclosed)
          next if stopping
          Herald.logger.error "herald worker #{pid} exited (#{result.inspect}); stopping the others"
          status = 1
          stopping = true
          forward("TERM")
        end
        status
      ensure
        previous&.each { |sig, handler| trap(sig, handler || "DEFAULT") }
      end

      def forward(sig)
        @pids.each do |pid|
          Process.kill(sig, pid)
        rescue Errno::ESRCH
          nil
        end
      end
    end
  end
end
