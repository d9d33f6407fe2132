# frozen_string_literal: true

# Poll requests/s: wrk on POST /message-bus/<id>/poll?dlp=t for a channel with 10 new messages (every
# reply carries the same 10), against message_bus 4.5.1's middleware on the same Puma settings.
require_relative "harness"
require_relative "support/http_servers"
require "herald"
require "json"
require "securerandom"

SECONDS = [(3 * Bench::SCALE).round, 1].max
ROUNDS = [Bench::ROUNDS, 3].min
LUA = <<~LUA
  wrk.method = "POST"
  wrk.body = "%2Fbench%2Fpoll=0"
  wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
  wrk.headers["X-Silence-Logger"] = "true"
LUA

def wrk(url, script)
  out = IO.popen(["wrk", "-t1", "-c16", "-d#{SECONDS}s", "-s", script, url], &:read)
  raise "wrk failed: #{out}" unless $?.success?
  raise "wrk saw errors: #{out}" if out.match?(/Non-2xx|Socket errors/)
  Float(out[/Requests\/sec:\s+([\d.]+)/, 1])
end

abort "bench/http_poll_bench.rb needs wrk (apt-get install wrk)" unless system("which wrk > /dev/null")

Dir.mktmpdir("herald-wrk") do |tmp|
  script = File.join(tmp, "poll.lua")
  File.write(script, LUA)
  Bench.section("HTTP poll requests/s (wrk, 10 messages per reply)",
    note: "`wrk -t1 -c16 -d#{SECONDS}s` over loopback, median of #{ROUNDS} runs; POST /message-bus/<id>/poll?dlp=t " \
          "with body `/bench/poll=0` on a channel holding 10 messages. One Puma process, #{Bench::THREADS} threads, " \
          "for both. #{Bench.store_note}") do |s|
    Bench::IMPLS.each do |name, impl|
      Bench.with_http_server(impl) do |server|
        10.times { |i| server.post("/test/publish", JSON.generate("channel" => "/bench/poll", "data" => {"n" => i, "text" => "message #{i}"})) }
        url = "#{server.url}/message-bus/#{SecureRandom.hex(16)}/poll?dlp=t"
        reply = server.post(url.delete_prefix(server.url), "%2Fbench%2Fpoll=0", content_type: "application/x-www-form-urlencoded")
        count = JSON.parse(reply.body).size
        raise "#{name}: a poll returned #{count} messages, expected 10" unless count == 10
        rates = Array.new(ROUNDS) { wrk(url, script) }
        s.add(name, Bench.median(rates), baseline: impl == "message_bus", unit: "req/s")
      end
    end
  end
end
