# frozen_string_literal: true

require "test_helper"
require "fileutils"
require "securerandom"
require "uri"
require_relative "../support/spawned_server"
require_relative "../support/http_fuzz/runner"
require_relative "../support/http_fuzz/framing"

# Random well-formed and malformed HTTP requests against a running `herald server` (a real process):
# bodies (form, JSON, MessagePack, garbage; invalid UTF-8, huge, empty), headers, content types, client
# ids, channel lists, methods, paths, chunked request bodies, truncated, slow, pipelined and abandoned
# connections, with slowloris connections held open throughout. It must never answer 5xx, never hang,
# never crash; valid polls and publishes keep working throughout; file descriptors and RSS come back.
#
#   SEED=123 bundle exec ruby -Itest test/server/http_fuzz_test.rb         replays a run
#   SEED=123 HTTP_FUZZ_CASE=42 ...                                          replays one case
#   HTTP_FUZZ_CASES=100000 bundle exec ruby -Itest test/server/http_fuzz_test.rb   a longer soak
#   HTTP_FUZZ_KINDS=huge,chunked_body ...                                   only some kinds of request
class HTTPFuzzTest < Minitest::Test
  CASES = Integer(ENV.fetch("HTTP_FUZZ_CASES", "3000"))
  KINDS = ENV["HTTP_FUZZ_KINDS"]&.split(",")&.map(&:to_sym) # e.g. huge,poll: aim a soak at some kinds
  SLOWLORIS = 40 # connections that send half a request and stay for the whole run
  WARMUP = 300

  def setup
    @dir = Dir.mktmpdir("herald-fuzz")
    @server = Herald::SpawnedServer.new(Herald::SpawnedServer.herald_command(@dir), dir: @dir)
    @seed = Integer(ENV.fetch("SEED", Random.new_seed % 2**32))
    @fuzz = Herald::HttpFuzz::Runner.new(host: "127.0.0.1", port: @server.port, seed: @seed, kinds: KINDS)
    @health = []
    @rss = [] # KiB, sampled with every health check
  end

  def teardown
    @slow&.each(&:close)
    status = @server.stop
    assert_predicate status, :success?, "the server should exit cleanly on SIGTERM: #{status.inspect}\n#{@server.output[-3000..]}"
  ensure
    FileUtils.rm_rf(@dir)
  end

  def test_random_requests_never_get_a_5xx_a_hang_or_a_leak
    if (one = ENV["HTTP_FUZZ_CASE"])
      return replay_one(Integer(one))
    end
    started = now
    @fuzz.run(0...[WARMUP, CASES].min) # first use allocates threads, buffers, the event loop
    fds, rss = settled_fds, rss_kb
    @slow = slowloris
    watcher = Thread.new { watch_health until @stop }
    @fuzz.run([WARMUP, CASES].min...CASES)
    @stop = true
    watcher.join
    @slow.each(&:close)
    end_fds, end_rss = settled_fds(target: fds), rss_kb
    result = @fuzz.result
    report(result, started, fds, end_fds, rss, end_rss)
    assert_empty result.failures, "seed #{@seed}: #{result.failures.size} failures (replay: SEED=#{@seed} HTTP_FUZZ_CASE=n)\n" \
      "#{result.failures.first(15).join("\n")}\nserver output:\n#{@server.output[-4000..]}"
    assert_equal CASES, result.sent
    assert_empty @health, "the server stopped serving valid requests: #{@health.first(5)}"
    assert_operator result.released, :>=, 1, "no parked poll was ever released by a publish" if CASES >= 500 && (KINDS.nil? || KINDS.include?(:release))
    assert_operator end_fds, :<=, fds + 2, "file descriptors: #{fds} after warm-up, #{end_fds} at the end"
    assert_operator end_rss, :<=, rss + [rss / 2, 64 * 1024].max, "RSS: #{rss} KiB after warm-up, #{end_rss} KiB at the end"
    refute_match(/ERROR|FATAL/, @server.output, "the server logged an error")
  end

  # RFC 9112 framing, case by case (test/support/http_fuzz/framing.rb: the section of each in its name),
  # each sent whole and again in random pieces, with a request pipelined behind it: the replies expected,
  # and after a refusal the connection closed (never a reset, never the request behind it answered).
  def test_rfc_9112_framing_cases
    random = Random.new(@seed)
    cases = Herald::HttpFuzz::Framing::CASES
    wrong = cases.product([nil, random]).filter_map do |c, pieces|
      got = Herald::HttpFuzz::Framing.exchange("127.0.0.1", @server.port, c, random: pieces)
      expected = {statuses: c.replies, closed: c.refused? || c.replies.size == 1}
      next if got == expected
      "#{c.name} (#{pieces ? "in pieces" : "whole"}): expected #{expected}, got #{got}\n    #{c.bytes.inspect}"
    end
    refused = cases.count(&:refused?)
    puts "\nRFC 9112 framing: SEED=#{@seed} #{cases.size} cases (#{cases.size - refused} served, #{refused} refused) x 2 deliveries: #{wrong.size} wrong"
    assert_empty wrong, "SEED=#{@seed}\n#{wrong.join("\n")}"
  end

  private

  def replay_one(index)
    c = Herald::HttpFuzz::Generator.new(@seed).case_at(index)
    puts "case #{index} (#{c.kind}, #{c.delivery}): #{c.bytes[0, 2000].inspect}"
    @fuzz.one(c)
    assert_empty @fuzz.result.failures, @server.output[-4000..]
  end

  # Every half second: an immediate poll answers 200, and a publish through the demo is readable at once.
  def watch_health
    started = now
    status, = @fuzz.check_poll
    @health << "poll answered #{status.inspect}" unless status == 200
    id = @fuzz.publish("health #{SecureRandom.hex(4)}")
    @health << "publish failed" unless id
    status, body = @fuzz.check_poll("/chat" => id - 1) if id
    @health << "message #{id} not readable: #{status} #{body.to_s[0, 200]}" if id && !body.to_s.include?("health")
    @health << "health check took #{(now - started).round(2)}s" if now - started > Herald::HttpFuzz::Runner::DEADLINE
    @rss << rss_kb
    sleep 0.5
  end

  # Connections that send half a request, then a header line now and then, until closed.
  def slowloris
    Array.new(SLOWLORIS) do |i|
      s = TCPSocket.new("127.0.0.1", @server.port)
      s.write("POST /message-bus/slow#{i}/poll HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
      s
    end
  end

  def settled_fds(target: nil, timeout: 15)
    deadline = now + timeout
    last = nil
    loop do
      count = Dir.children("/proc/#{@server.pid}/fd").size
      return count if target ? count <= target : count == last
      return count if now > deadline
      last = count
      sleep 0.3
    end
  end

  def rss_kb = File.read("/proc/#{@server.pid}/status")[/VmRSS:\s+(\d+)/, 1].to_i

  def report(result, started, fds, end_fds, rss, end_rss)
    statuses = result.statuses.sort.map { |s, n| "#{s}: #{n}" }.join(", ")
    puts "\nhttp fuzz: SEED=#{@seed} cases=#{result.sent} in #{(now - started).round(1)}s; " \
      "5xx other than 501/505: #{result.statuses.sum { |s, n| (s >= 500 && !Herald::HttpFuzz::Runner::NOT_IMPLEMENTED.include?(s)) ? n : 0 }}; failures: #{result.failures.size}\n" \
      "  statuses #{statuses}; 501/505 (unknown method, transfer coding, HTTP version): #{result.not_implemented}; " \
      "parked and walked away: #{result.silent_parks}; parked polls released by a publish: #{result.released}; huge requests reset before their reply: #{result.resets}; " \
      "closed unanswered once, answered when sent again: #{result.unanswered_once}\n" \
      "  fds #{fds} -> #{end_fds}; RSS #{rss / 1024} MiB -> #{end_rss / 1024} MiB (by quarter of the run: " \
      "#{quarters(@rss).map { |kb| kb / 1024 }.join(", ")}); health checks failed: #{@health.size}"
  end

  def quarters(samples) = samples.empty? ? [] : (1..4).map { |q| samples[(samples.size * q / 4) - 1] }

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
