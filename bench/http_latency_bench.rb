# frozen_string_literal: true

# Publish -> delivery latency to 1,000 parked long-poll clients, measured by the clients: a separate
# process (bench/support/http_clients.rb, nio4r) parks the polls, publishes one message carrying the wall
# clock, and takes each client's latency when its reply is complete. p50/p99 over every client and round.
require_relative "harness"
require_relative "support/http_servers"
require "herald"
require "json"

CLIENTS = [(1000 * Bench::SCALE).to_i, 10].max
ROUNDS = 5

def measure(server)
  command = [RbConfig.ruby, File.join(Bench::HTTP_ROOT, "bench/support/http_clients.rb"), "latency",
    server.port.to_s, CLIENTS.to_s, ROUNDS.to_s]
  rounds = IO.popen(command, &:readlines).map { |line| JSON.parse(line) }
  raise "client process failed" unless $?.success? && rounds.size == ROUNDS
  samples = rounds.flatten
  missing = samples.count(&:nil?)
  [samples.compact.sort.map { |s| s * 1000 }, missing + (CLIENTS * ROUNDS - samples.size)]
end

rows = Bench::IMPLS.map do |name, impl|
  Bench.with_http_server(impl) { |server| [name, *measure(server)] }
end

base = rows.first
puts "### Publish -> delivery latency, #{CLIENTS} parked long-poll clients", ""
puts "One server process (Puma, #{Bench::THREADS} threads), one client process holding #{CLIENTS} connections " \
     "(POST /message-bus/<id>/poll with `Dont-Chunk: true`), #{ROUNDS} rounds of one publish each; latency = " \
     "client receive time - publish time stamped in the message data. #{Bench.store_note}", ""
puts "| | p50 | p99 | max | p99 vs #{base[0]} | missed |", "|---|---:|---:|---:|---:|---:|"
rows.each do |name, ms, missed|
  p50, p99 = Bench.percentile(ms, 0.5), Bench.percentile(ms, 0.99)
  base_p99 = Bench.percentile(base[1], 0.99)
  puts format("| %s | %.1f ms | %.1f ms | %.1f ms | %.2fx | %d |", name, p50, p99, ms.last, p99 / base_p99, missed)
end
puts
if (herald = rows.find { |name, _| name.start_with?("Herald") }) && rows.size > 1
  p99 = Bench.percentile(herald[1], 0.99)
  puts format("Target (1,000 clients) p99 <= 25 ms and below message_bus: %.1f ms (%s). The client process shares the 2 cores with the " \
    "server, so its own reading of %d sockets is part of the figure.", p99,
    (p99 <= 25 && p99 < Bench.percentile(base[1], 0.99)) ? "met" : "missed by #{format("%.1f", p99 - 25)} ms", CLIENTS)
  puts
end
