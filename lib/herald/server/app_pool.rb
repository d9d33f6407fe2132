# frozen_string_literal: true

module Herald
  class Server
    # The front's threads for requests not answered on its loop (the demo page, an app's routes), so a slow
    # app never holds up the polls. An Array body goes back to the loop to be written; a streaming body is
    # written from the pool thread (blocking) and the connection then goes back to the loop.
    class AppPool
      # app: the Rack app. head: a ResponseHead. log: a PumaLog. done: called on the pool thread with what
      # goes back to the loop: [conn, env, status, headers, body, keep] for a reply to write, [conn, :hijacked],
      # or [conn, keep] once a streamed body is written (false: close the connection).
      def initialize(app:, threads:, head:, log:, done:)
        @app = app
        @head = head
        @log = log
        @done = done
        @jobs = Thread::Queue.new
        @threads = Array.new(threads) { |i| worker(i) }
      end

      def <<(job) # [conn, env, keep]
        @jobs << job
      end

      # Runs the app here; an exception is logged and answered with a 500.
      def call_app(env)
        @app.call(env)
      rescue => e
        @log.unknown_error(e, env, "Rack app")
        ResponseHead.error_response(500, ": the error is in the server's log")
      end

      # No new jobs; waits for the threads until `deadline` (monotonic), leaving behind one still in the app.
      def stop(deadline)
        @jobs.close
        @threads.each { |t| t.join([deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC), 0].max) }
      end

      private

      def worker(index)
        Thread.new do
          Thread.current.name = "herald-app-#{index}" if Thread.current.respond_to?(:name=)
          while (job = @jobs.pop)
            @done.call(run_job(*job))
          end
        end
      end

      def run_job(conn, env, keep)
        status, headers, body = call_app(env)
        return [conn, :hijacked] if env[Rack::EnvKeys::HIJACKED]
        return [conn, env, status, headers, body, keep] if body.is_a?(Array)
        [conn, stream(conn, env, status, headers, body, keep)]
      rescue => e # a body that fails while streaming: the connection ends, the thread stays
        @log.unknown_error(e, env, "Rack app")
        [conn, false]
      end

      # A body that is not an Array (an app streaming): chunked on HTTP/1.1 unless the app gave a length;
      # on HTTP/1.0 without a length the connection closes to end it.
      def stream(conn, env, status, headers, body, keep)
        bodyless = ResponseHead.bodyless?(env, status)
        length = headers.any? { |k, _| k.to_s.casecmp("content-length") == 0 }
        chunked = !bodyless && !length && env["SERVER_PROTOCOL"] == "HTTP/1.1"
        keep &&= bodyless || length || chunked
        return callable_body(conn, env, status, headers, body) if !body.respond_to?(:each) && body.respond_to?(:call)
        conn.io.write(@head.call(env, status, headers, nil, keep, chunked: chunked))
        unless bodyless
          body.each do |part|
            next if part.empty?
            conn.io.write(chunked ? "#{part.bytesize.to_s(16)}\r\n#{part}\r\n" : part)
          end
          conn.io.write("0\r\n\r\n") if chunked
        end
        keep
      rescue IOError, SystemCallError
        false
      ensure
        body.close if body.respond_to?(:close)
      end

      # A Rack 3 streaming body (#call with the stream): it writes what it likes; the connection closes after.
      def callable_body(conn, env, status, headers, body)
        conn.io.write(@head.call(env, status, headers, nil, false))
        body.call(conn.io)
        false
      end
    end
  end
end
