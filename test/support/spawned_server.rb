# frozen_string_literal: true

require "net/http"
require "json"
require "rbconfig"

module Herald
  # A server in a child process on a free port: the real `exe/herald server`, or test/support/http_server.rb
  # (the same Puma and demo app, in front of Herald or of message_bus for comparison).
  # HERALD_TEST_IMPL=message_bus runs the real-client tests against message_bus's own middleware.
  class SpawnedServer
    ROOT = File.expand_path("../..", __dir__)
    attr_reader :port, :dir, :pid

    # What the server printed (standard output and error), its last 64 KiB.
    def output = @output.dup

    def self.herald_command(dir) = [RbConfig.ruby, File.join(ROOT, "exe/herald"), "server", "--port", "0", "--dir", dir]

    def self.impl = ENV.fetch("HERALD_TEST_IMPL", "herald")

    # The real command when testing Herald; the support script (message_bus middleware) otherwise.
    def self.start(dir:)
      command = if impl == "herald"
        herald_command(dir)
      else
        [RbConfig.ruby, File.join(ROOT, "test/support/http_server.rb"), "--impl", impl, "--dir", dir]
      end
      new(command, dir: dir)
    end

    def initialize(command, dir:)
      @dir = dir
      @reader, writer = IO.pipe
      # Room for thousands of parked connections (the benchmarks hold 10,000).
      nofile = Process.getrlimit(:NOFILE)[1]
      @pid = Process.spawn(*command, out: writer, err: writer, chdir: dir, rlimit_nofile: [nofile, nofile])
      writer.close
      @port = wait_for_port
    end

    def url = "http://127.0.0.1:#{port}"

    def post(path, body, content_type: "application/json")
      Net::HTTP.post(URI("#{url}#{path}"), body, "Content-Type" => content_type)
    end

    # Publishes from another process: `exe/herald publish CHANNEL JSON --dir DIR` on the same log.
    def cli_publish(channel, data)
      out = IO.popen([RbConfig.ruby, File.join(ROOT, "exe/herald"), "publish", channel, JSON.generate(data),
        "--dir", dir], err: [:child, :out], &:read)
      raise "herald publish failed: #{out}" unless $?.success?
      Integer(out)
    end

    # Signals the server and returns its exit status (the same status again once it has stopped).
    def stop(signal = :TERM)
      return @status unless @pid
      Process.kill(signal, @pid)
      _, @status = Process.wait2(@pid)
      @pid = nil
      @status
    end

    private

    def wait_for_port
      @output = +""
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      until (port = @output[/listening (?:on http:\/\/[\d.]+:)?(\d+)/, 1])
        remaining = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise "server did not start: #{@output}" if remaining <= 0 || !@reader.wait_readable(remaining)
        chunk = @reader.read_nonblock(4096, exception: false)
        raise "server exited: #{@output}" if chunk.nil?
        @output << chunk if chunk.is_a?(String)
      end
      # Keep draining its output so a chatty server never blocks on a full pipe; the last 64 KiB are kept.
      Thread.new do
        @reader.each_line do |line|
          @output << line
          @output = @output.byteslice(-65_536, 65_536) if @output.bytesize > 65_536
        end
      end
      Integer(port)
    end
  end
end
