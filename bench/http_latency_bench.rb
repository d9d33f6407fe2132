# frozen_string_literal: true

# Publish -> delivery latency to 1,000 parked long-poll clients, measured by the clients: a separate
# process (bench/support/http_clients.rb, nio4r) parks the polls, publishes one message carrying the wall
# clock, and takes each client's latency when its reply is complete. p50/p99 over every client and round.
# Both servers run at once and the rounds alternate between them, so drifting load hits both alike.
require_relative "harness"
require_relative "support/http_servers"
require "herald"
require "json"

CLIENTS = [(1000 * Bench::SCALE).to_i, 10].max
ROUNDS = [Bench::ROUNDS, 3].max

# One round (one publish to CLIENTS parked polls): [latencies in ms, clients that got nothing].
def measure_round(server)
  command = [RbConfig.ruby, File.join(Bench::HTTP_ROOT, "bench/support/http_clients.rb"), "latency",
    server.port.to_s, CLIENTS.to_s, "1"]
  rounds = IO.popen(command, &:readlines).map { |line| JSON.parse(line) }
  raise "client process failed" unless $?.success? && rounds.size == 1
  samples = rounds.flatten
  [samples.compact.map { |s| s * 1000 }, samples.count(&:nil?) + (CLIENTS - samples.size)]
end

load_before = Bench.loadavg
rounds = Hash.new { |h, k| h[k] = [] }
Bench.with_http_servers(Bench::IMPLS) do |servers|
  ROUNDS.times { servers.each { |name, server| rounds[name] << measure_round(server) } }
end
load_after = Bench.loadavg

rows = rounds.map do |name, list|
  ms = list.flat_map(&:first).sort
  p99s = list.map { |round, _| Bench.percentile(round.sort, 0.99) }.compact
  warn "#{name}: rounds #{list.map { |round, missed| "#{round.size} answered, #{missed} missed" }.join("; ")}" if ENV["BENCH_DEBUG"]
  [name, ms, list.sum(&:last), p99s]
end
base = rows.first
puts "### Publish -> delivery latency, #{CLIENTS} parked long-poll clients", ""
puts "One server process per implementation (Puma, #{Bench::THREADS} threads), both up at once; one client process " \
     "holding #{CLIENTS} connections (POST /message-bus/<id>/poll with `Dont-Chunk: true`), #{ROUNDS} rounds of one " \
     "publish each, alternating between the servers; latency = client receive time - publish time stamped in the " \
     "message data. p50/p99/max over every client of every round; the spread is the min-max of the per-round p99. " \
     "Load average #{load_before} before, #{load_after} after (2 cores shared with other work). #{Bench.store_note}", ""
puts "| | p50 | p99 | per-round p99 (min-max) | max | p99 vs #{base[0]} | missed |", "|---|---:|---:|---:|---:|---:|---:|"
rows.each do |name, ms, missed, p99s|
  p50, p99 = Bench.percentile(ms, 0.5), Bench.percentile(ms, 0.99)
  base_p99 = Bench.percentile(base[1], 0.99)
  next puts "| #{name} | - | - | - | - | - | #{missed} |" if ms.empty?
  puts format("| %s | %.1f ms | %.1f ms | %.1f-%.1f ms | %.1f ms | %.2fx | %d |", name, p50, p99, p99s.min, p99s.max,
    ms.last, p99 / base_p99, missed)
end
puts
if (herald = rows.find { |name, _| name.start_with?("Herald") }) && rows.size > 1
  p99 = Bench.percentile(herald[1], 0.99)
  puts format("Target (1,000 clients) p99 <= 25 ms and below message_bus: %.1f ms (%s). The client process shares the 2 cores with the " \
    "server, so its own reading of %d sockets is part of the figure.", p99,
    (p99 <= 25 && p99 < Bench.percentile(base[1], 0.99)) ? "met" : "missed by #{format("%.1f", p99 - 25)} ms", CLIENTS)
  puts
end
