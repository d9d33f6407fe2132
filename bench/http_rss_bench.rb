# frozen_string_literal: true

# Memory of one server process holding 10,000 idle streaming clients: RSS with the clients connected minus
# RSS before, per client. The clients are a separate process (bench/support/http_clients.rb).
require_relative "harness"
require_relative "support/http_servers"
require "herald"

CLIENTS = [(10_000 * Bench::SCALE).to_i, 100].max

def measure(server)
  # Warm up: one poll through every code path before the baseline reading.
  server.post("/message-bus/warmup/poll?dlp=t", "%2Fidle=-1", content_type: "application/x-www-form-urlencoded")
  GC.start
  sleep 0.5
  before = Bench.rss_kb(server.pid)
  command = [RbConfig.ruby, File.join(Bench::HTTP_ROOT, "bench/support/http_clients.rb"), "idle",
    server.port.to_s, CLIENTS.to_s]
  IO.popen(command, "r+") do |clients|
    ready = clients.gets.to_s.split
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    sleep 1
    after = Bench.rss_kb(server.pid)
    clients.puts "stop"
    open = clients.gets.to_s.split[1].to_i
    [before, after, Integer(ready[1]), open, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end
end

rows = Bench::IMPLS.map do |name, impl|
  Bench.with_http_server(impl) { |server| [name, *measure(server)] }
end

puts "### RSS of one server process holding #{CLIENTS} idle streaming clients", ""
puts "Streaming polls (chunked, HTTP/1.1) on /idle from a separate client process; RSS from /proc/<pid>/status " \
     "before the clients connect and once every client got its first chunk. Both servers allow 20,000 clients. " \
     "#{Bench.store_note}", ""
puts "| | RSS before | RSS with clients | per client | clients answered | still open at the reading |",
  "|---|---:|---:|---:|---:|---:|"
rows.each do |name, before, after, ready, open, _|
  puts format("| %s | %.1f MB | %.1f MB | %.1f KB | %d | %d |", name, before / 1024.0, after / 1024.0,
    (after - before).fdiv(CLIENTS), ready, open)
end
puts
if (herald = rows.find { |name, _| name.start_with?("Herald") })
  per = (herald[2] - herald[1]).fdiv(CLIENTS)
  puts format("Target <= 20 KB per client: %.1f KB (%s). RSS counts the process's memory, not the kernel's socket " \
    "buffers.", per, (per <= 20) ? "met" : "missed")
  puts
end
