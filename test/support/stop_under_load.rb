# frozen_string_literal: true

require "socket"
require "json"
require "logger"
require "stringio"
require "timeout"
require_relative "spawned_server"

module Herald
  # Rounds of "SIGTERM at a random moment" against a real `herald server` while keep-alive clients publish
  # through the demo's POST /chat (a request the server runs on its thread pool) and long polls wait on
  # /chat (parked in the middleware's event loop, each answered or ended by the stop). After each round:
  # the exit status, the server's output, the log read record by record (what was acknowledged must be
  # there, with the acknowledged id; what got no reply must not have been published), and the next open
  # of the store (it must not report an unclean stop).
  class StopUnderLoad
    CLIENTS = 8
    POLLERS = 2
    STOP_WITHIN = 0.05..0.8 # seconds of load before the signal
    EXIT_WITHIN = 20 # seconds the server may take to exit after the signal (its grace period is 5)
    REPLY_WITHIN = 15 # seconds a client waits for a reply before calling it a hang
    UNCLEAN = /stopped without closing the store/
    BAD_OUTPUT = /IOError|ERROR|FATAL|\.rb:\d+:in /

    Tally = Struct.new(:rounds, :requests, :acknowledged, :acknowledged_after_signal, :clean_closes, :resets,
      :lost, :unanswered_published, :unclean_opens, :exits, :polls, :polls_after_signal, :poll_closes, :poll_resets,
      :failures, keyword_init: true) do
      def to_s
        "rounds #{rounds}, requests #{requests}, acknowledged #{acknowledged} (#{acknowledged_after_signal} after the signal), " \
          "closed unanswered #{clean_closes} (cleanly) + #{resets} (reset), lost #{lost}, published but unanswered " \
          "#{unanswered_published}, unclean stops seen on the next open #{unclean_opens}, exit codes #{exits.sort.to_h}; " \
          "long polls answered #{polls} (#{polls_after_signal} after the signal), closed unanswered #{poll_closes} + #{poll_resets} (reset)"
      end
    end

    # args: extra `herald server` arguments (["--puma"], ["--workers", "2"]).
    def initialize(dir:, args: [], seed: Random.new_seed % 2**32)
      @dir = dir
      @args = args
      @random = Random.new(seed)
      @tally = Tally.new(rounds: 0, requests: 0, acknowledged: 0, acknowledged_after_signal: 0, clean_closes: 0, resets: 0,
        lost: 0, unanswered_published: 0, unclean_opens: 0, exits: Hash.new(0), polls: 0, polls_after_signal: 0, poll_closes: 0,
        poll_resets: 0, failures: [])
    end

    attr_reader :tally

    def run(rounds)
      rounds.times { |n| round(n) }
      @tally
    end

    private

    def round(n)
      server = SpawnedServer.new(SpawnedServer.herald_command(@dir) + @args, dir: @dir)
      signaled = nil
      clients = Array.new(CLIENTS) { |c| Thread.new { client(server.port, "r#{n}c#{c}", -> { signaled }) } }
      pollers = Array.new(POLLERS) { |c| Thread.new { poller(server.port, "r#{n}p#{c}", -> { signaled }) } }
      sleep @random.rand(STOP_WITHIN)
      signaled = now
      status = stop(server)
      results = clients.flat_map(&:value)
      check(n, server, status, results, signaled)
      check_polls(n, server, pollers.flat_map(&:value), signaled)
    ensure
      clients&.each(&:kill)
      pollers&.each(&:kill)
    end

    def stop(server)
      Timeout.timeout(EXIT_WITHIN) { server.stop(:TERM) }
    rescue Timeout::Error
      Process.kill(:KILL, server.pid)
      server.stop(:KILL)
      nil
    end

    # One keep-alive connection publishing one message after another; after the signal, a connection that
    # ends is not replaced. Returns [[text, outcome, message_id, answered_at]].
    def client(port, tag, signaled)
      results = []
      socket = nil
      (0..).each do |i|
        socket ||= connect(port) or break
        text = "#{tag}n#{i}"
        outcome, id, keep = exchange(socket, text)
        results << [text, outcome, id, now]
        next if outcome == :ok && keep
        socket.close
        socket = nil
        break if signaled.call || outcome != :ok
      end
      results
    ensure
      socket&.close
    end

    # Long polls on /chat, one after another (each on its own connection: a parked poll's reply closes it),
    # from the last id seen, none started after the signal. Returns [[outcome, answered_at]].
    def poller(port, client_id, signaled)
      results = []
      last = -1
      until signaled.call
        socket = connect(port) or break
        outcome, last = poll(socket, client_id, last)
        results << [outcome, now]
        socket.close
      end
      results
    end

    def poll(socket, client_id, last)
      body = JSON.generate("/chat" => last)
      socket.write("POST /message-bus/#{client_id}/poll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
        "Dont-Chunk: true\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
      outcome, reply = read_reply(socket, expect: 200)
      return [outcome, last] unless outcome == :ok
      [:ok, JSON.parse(reply).map { |m| (m["channel"] == "/__status") ? m["data"]["/chat"] : m["message_id"] }.compact.max || last]
    rescue Errno::EPIPE, Errno::ECONNRESET
      [:reset, last]
    end

    def connect(port)
      TCPSocket.new("127.0.0.1", port)
    rescue SystemCallError
      nil # refused: the server stopped listening
    end

    def exchange(socket, text)
      body = "name=stop&text=#{text}"
      socket.write("POST /chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n" \
        "Content-Length: #{body.bytesize}\r\n\r\n#{body}")
      outcome, reply, keep = read_reply(socket)
      (outcome == :ok) ? [:ok, JSON.parse(reply)["message_id"], keep] : [outcome]
    rescue Errno::EPIPE, Errno::ECONNRESET
      [:reset]
    end

    # [:ok, body, keep-alive?], [:closed] (EOF before any byte), [:reset], [:partial], [:hang], [:status_N].
    def read_reply(socket, expect: 201)
      buffer = +"".b
      deadline = now + REPLY_WITHIN
      until (head_end = buffer.index("\r\n\r\n")) && buffer.bytesize >= head_end + 4 + length(buffer, head_end)
        return [:hang] unless socket.wait_readable([deadline - now, 0].max)
        chunk = socket.read_nonblock(65_536, exception: false)
        return [buffer.empty? ? :closed : :partial] if chunk.nil?
        buffer << chunk if chunk.is_a?(String)
      end
      head = buffer.byteslice(0, head_end)
      status = head[/\AHTTP\/1\.[01] (\d{3})/, 1].to_i
      return [:"status_#{status}"] unless status == expect
      [:ok, buffer.byteslice(head_end + 4, length(buffer, head_end)), !head.match?(/^connection: close/i)]
    rescue Errno::ECONNRESET
      [buffer.empty? ? :reset : :partial]
    end

    def length(buffer, head_end) = buffer.byteslice(0, head_end)[/^content-length: *(\d+)/i, 1].to_i

    def check(n, server, status, results, signaled)
      t = @tally
      t.rounds += 1
      t.exits[status&.exitstatus || "hung"] += 1
      fail!(n, "exit #{status.inspect}", server) unless status&.exitstatus == 0
      fail!(n, "the server's output shows an error", server) if server.output.match?(BAD_OUTPUT)
      unclean = reopen_log
      t.unclean_opens += 1 if unclean
      fail!(n, "the next open says: #{unclean}", server) if unclean
      check_records(n, server, results, signaled)
    end

    def check_records(n, server, results, signaled)
      t = @tally
      stored = records
      results.each do |text, outcome, id, at|
        t.requests += 1
        case outcome
        when :ok
          t.acknowledged += 1
          t.acknowledged_after_signal += 1 if at > signaled
          next if stored[text] == id
          t.lost += 1
          fail!(n, "#{text} acknowledged as #{id}, in the log as #{stored[text].inspect}", server)
        when :closed, :reset
          (outcome == :closed) ? t.clean_closes += 1 : t.resets += 1
          next unless stored.key?(text)
          t.unanswered_published += 1
          fail!(n, "#{text} was published (id #{stored[text]}) but its connection ended without the reply (#{outcome})", server)
        else
          fail!(n, "#{text}: #{outcome}", server)
        end
      end
      ids = stored.values.sort
      fail!(n, "message ids jump: #{ids.each_cons(2).find { |a, b| b != a + 1 }}", server) unless ids == (1..ids.size).to_a
    end

    # A long poll is answered (a publish released it, or the stop ended it with its final reply) or its
    # connection closes before it was read; nothing half written, nothing left hanging.
    def check_polls(n, server, results, signaled)
      t = @tally
      results.each do |outcome, at|
        case outcome
        when :ok
          t.polls += 1
          t.polls_after_signal += 1 if at > signaled
        when :closed then t.poll_closes += 1
        when :reset then t.poll_resets += 1
        else fail!(n, "a long poll: #{outcome}", server)
        end
      end
    end

    # Opens the log as the next server would; returns what it says about an unclean stop (nil: nothing).
    def reopen_log
      out = StringIO.new
      previous = Herald.logger
      Herald.logger = Logger.new(out)
      Store::Log.new(dir: @dir).close
      out.string[/.*#{UNCLEAN}.*/o]
    ensure
      Herald.logger = previous
    end

    # Every record of the log, read segment by segment (retention aside): {text => message_id}.
    def records
      Dir.children(@dir).filter_map { |f| Store::Log::Segment.first_id(f) }.sort.each_with_object({}) do |first, out|
        segment = Store::Log::Segment.new(@dir, first, writable: false)
        segment.read_new(on_corrupt: ->(offset) { raise "damaged record at #{offset} in #{segment.path}" }) do |buffer, pos, size, _|
          msg = Store::Log::Record.decode(buffer, pos, size)
          out[JSON.parse(msg.payload)["text"]] = msg.message_id if msg.channel == "/chat"
        end
      ensure
        segment&.close
      end
    end

    def fail!(n, what, server)
      @tally.failures << "round #{n}: #{what}\n  server output: #{server.output[-1500..] || server.output}"
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
