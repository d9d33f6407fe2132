# frozen_string_literal: true

require "open3"
require "rbconfig"

module Herald
  # Runs the real `exe/herald` in a child process, with none of the caller's HERALD_* settings.
  module HeraldCLI
    EXE = File.expand_path("../../exe/herald", __dir__)
    CLEAN_ENV = {"HERALD_DIR" => nil, "HERALD_STORE" => nil, "DATABASE_URL" => nil}.freeze

    # => [stdout, stderr, Process::Status]. A command still running after `timeout` seconds (a server
    # that started when it should have refused) is killed: status nil, and stderr says so.
    def herald(*args, env: {}, chdir: Dir.pwd, timeout: 60)
      Open3.popen3(CLEAN_ENV.merge(env), RbConfig.ruby, EXE, *args, chdir: chdir) do |stdin, out, err, thread|
        stdin.close
        readers = [out, err].map { |io| Thread.new { io.binmode.read } }
        unless thread.join(timeout)
          Process.kill(:KILL, thread.pid)
          return [readers[0].value, "#{readers[1].value}(still running after #{timeout} s: killed)", nil]
        end
        [*readers.map(&:value), thread.value]
      end
    end

    # Publishes through the CLI and returns the id it printed.
    def herald_publish(channel, json, dir:, env: {})
      out, err, status = herald("publish", channel, json, "--dir", dir, env: env)
      assert status&.success?, "herald publish #{channel} #{json} failed: #{err}"
      Integer(out)
    end

    # A running `herald tail`: read its lines as they come, then stop it.
    class Tail
      attr_reader :pid

      def initialize(*args, env: {})
        @out, out_w = IO.pipe
        @err, err_w = IO.pipe
        [@out, @err].each(&:binmode)
        @pid = Process.spawn(CLEAN_ENV.merge(env), RbConfig.ruby, EXE, "tail", *args, out: out_w, err: err_w)
        [out_w, err_w].each(&:close)
        @buffers = {@out => +"".b, @err => +"".b}
      end

      # The next line on standard output (bytes, newline removed), or nil after `timeout` seconds.
      def gets(timeout: 30, io: @out)
        buffer = @buffers.fetch(io)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        until (line = buffer.slice!(/\A[^\n]*\n/))
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return nil if left <= 0 || !io.wait_readable(left)
          buffer << (io.read_nonblock(65_536, exception: false) || (return nil))
        end
        line.chomp
      end

      # The next line on standard error (tail's note comes after its signal handlers are in place).
      def err_gets(timeout: 30) = gets(timeout: timeout, io: @err)

      def close_stdout = @out.close

      # Sends `signal` (nil: none) and returns [Process::Status or nil if it did not exit in time, stderr].
      def stop(signal = :TERM, timeout: 30)
        Process.kill(signal, @pid) if signal
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        until (status = Process.wait2(@pid, Process::WNOHANG)&.last) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          sleep 0.02
        end
        unless status
          Process.kill(:KILL, @pid)
          Process.wait(@pid)
        end
        [status, @buffers[@err] + @err.read]
      ensure
        @out.close unless @out.closed?
        @err.close
      end
    end
  end
end
