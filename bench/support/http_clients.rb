# frozen_string_literal: true

# The client side of bench/http_*_bench.rb, in its own process (so the server's CPU and RSS are its own):
# many raw HTTP/1.1 connections on one nio4r selector, speaking the message_bus poll protocol.
#
#   ruby bench/support/http_clients.rb latency PORT CLIENTS ROUNDS
#     parks CLIENTS long polls (Dont-Chunk) on /lat, publishes one message stamped with the wall clock,
#     and prints one JSON line of every client's publish -> delivery latency (seconds), per round.
#   ruby bench/support/http_clients.rb idle PORT CLIENTS
#     opens CLIENTS streaming polls on /idle, prints "ready N" once each got its first chunk, then waits
#     for a line on stdin and prints "open N" (how many are still open) before exiting.
require "nio"
require "socket"
require "json"
require "net/http"
require "securerandom"

Process.setrlimit(:NOFILE, Process.getrlimit(:NOFILE)[1])

class PollConnection
  attr_reader :buffer, :socket

  def initialize(port, channel, last_id, chunked:)
    @socket = Socket.tcp("127.0.0.1", port)
    @socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
    body = "#{URI.encode_www_form_component(channel)}=#{last_id}"
    @socket.write("POST /message-bus/#{SecureRandom.hex(16)}/poll HTTP/1.1\r\nHost: 127.0.0.1\r\n" \
      "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: #{body.bytesize}\r\n" \
      "#{"Dont-Chunk: true\r\n" unless chunked}X-Silence-Logger: true\r\n\r\n#{body}")
    @buffer = +""
    @eof = false
  end

  # One read per readiness event (the selector is level-triggered: more data means ready again), so the
  # client spends one syscall per reply; true once the connection was closed by the server.
  def read
    chunk = @socket.read_nonblock(65_536, exception: false)
    return false if chunk == :wait_readable
    return @eof = true if chunk.nil?
    @buffer << chunk
    false
  rescue Errno::ECONNRESET
    @eof = true
  end

  def eof? = @eof

  # A complete non-chunked reply (content-length) or, for a stream, at least one complete chunk.
  def complete_reply?
    head, body = @buffer.split("\r\n\r\n", 2)
    return false unless body
    length = head[/content-length: *(\d+)/i, 1]
    length ? body.bytesize >= Integer(length) : body.include?("\r\n|\r\n")
  end

  def messages
    body = @buffer.split("\r\n\r\n", 2)[1].to_s
    json = body[/\[.*\]/m]
    json ? JSON.parse(json) : []
  end

  def close = @socket.close
end

def publish(port, channel, data)
  response = Net::HTTP.post(URI("http://127.0.0.1:#{port}/test/publish"),
    JSON.generate("channel" => channel, "data" => data), "Content-Type" => "application/json")
  Integer(JSON.parse(response.body).fetch("message_id"))
end

# Sends the publish request without waiting for its reply, so the clients' sockets are read meanwhile.
def publish_async(port, channel, data)
  body = JSON.generate("channel" => channel, "data" => data)
  socket = Socket.tcp("127.0.0.1", port)
  socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
  socket.write("POST /test/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" \
    "Content-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n#{body}")
  socket
end

# Reads on every ready connection until `done` says stop or the deadline passes.
def pump(selector, deadline)
  loop do
    remaining = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
    return false if remaining <= 0
    selector.select(remaining) { |monitor| monitor.value.call }
    return true if yield
  end
end

def latency(port, clients, rounds)
  last_id = publish(port, "/lat", {"warmup" => true})
  rounds.times do
    selector = NIO::Selector.new
    connections = Array.new(clients) { PollConnection.new(port, "/lat", last_id, chunked: false) }
    done = []
    connections.each do |c|
      monitor = selector.register(c.socket, :r)
      monitor.value = lambda do
        c.read
        # A long-poll reply is one JSON array: complete when the body ends with "]". The clock first;
        # parsing and closing wait until every client has its reply, so they do not delay the others.
        next unless c.buffer.end_with?("]") || c.eof?
        done << [Process.clock_gettime(Process::CLOCK_REALTIME), c]
        monitor.close
      end
    end
    sleep [1.5, clients / 2000.0].max # let every poll reach the server and park (10,000 take seconds)
    publisher = publish_async(port, "/lat", {"t" => Process.clock_gettime(Process::CLOCK_REALTIME)})
    pump(selector, Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20) { done.size == clients }
    publisher.close
    connections.each { |c| c.close unless c.socket.closed? }
    selector.close
    latencies = done.map do |now, c|
      sent = c.messages.find { |m| m["channel"] == "/lat" }&.dig("data", "t")
      sent && now - sent
    end
    last_id = done.flat_map { |_, c| c.messages }.select { |m| m["channel"] == "/lat" }.map { |m| m["message_id"] }.max || last_id
    puts JSON.generate(latencies)
    $stdout.flush
  end
end

def idle(port, clients)
  selector = NIO::Selector.new
  ready = 0
  connections = []
  clients.times.each_slice(500) do |slice|
    slice.each do
      c = PollConnection.new(port, "/idle", -1, chunked: true)
      connections << c
      counted = false
      monitor = selector.register(c.socket, :r)
      monitor.value = lambda do
        c.read
        if !counted && (c.complete_reply? || c.eof?)
          counted = true
          ready += 1
        end
        selector.deregister(c.socket) if c.eof?
      end
    end
    pump(selector, Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30) { ready == connections.size }
  end
  puts "ready #{ready} #{connections.count { |c| !c.eof? }}"
  $stdout.flush
  $stdin.gets
  selector.select(0) { |monitor| monitor.value.call }
  puts "open #{connections.count { |c| !c.eof? }}"
  $stdout.flush
  connections.each(&:close)
end

mode, port, *rest = ARGV
case mode
when "latency" then latency(Integer(port), Integer(rest[0]), Integer(rest[1]))
when "idle" then idle(Integer(port), Integer(rest[0]))
else abort "usage: http_clients.rb latency|idle PORT CLIENTS [ROUNDS]"
end
