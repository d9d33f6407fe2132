# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require "socket"
require_relative "../support/spawned_server"
require_relative "../../bench/support/fan_out_trace"

# Worker processes on one port (Herald::Server reuse_port: true, SO_REUSEPORT), as
# test/support/http_server.rb --workers forks them for bench/http_latency_bench.rb: the kernel spreads the
# parked polls over both, and a message published through either reaches the polls parked on the other
# (the log's cross-process wakeup), each worker writing its own share.
class ReusePortWorkersTest < Minitest::Test
  CLIENTS = 40

  def setup
    @dir = Dir.mktmpdir("herald-workers")
    command = [RbConfig.ruby, File.join(Herald::SpawnedServer::ROOT, "test/support/http_server.rb"), "--impl", "herald",
      "--dir", @dir, "--workers", "2", "--trace"]
    @server = Herald::SpawnedServer.new(command, dir: @dir)
  end

  def teardown
    @sockets&.each(&:close)
    assert_predicate @server.stop, :success?, @server.output
    FileUtils.rm_rf(@dir)
  end

  def test_one_publish_reaches_polls_parked_on_both_workers
    data = "héllo 🎉 #{"x" * 100}"
    last = Integer(JSON.parse(@server.post("/test/publish", JSON.generate("channel" => "/w", "data" => "first")).body)["message_id"])
    @sockets = Array.new(CLIENTS) { |i| poll("w#{i}", last) }
    sleep 1 # every poll parked (nothing to tell from outside which worker holds which)
    @server.post("/test/publish", JSON.generate("channel" => "/w", "data" => {"t" => 1, "s" => data}))
    replies = @sockets.map { |s| read_reply(s) }
    replies.each { |body| assert_equal [{"t" => 1, "s" => data}], JSON.parse(body).map { |m| m["data"].slice("t", "s") } }
    writes = Bench::FanOutTrace.collect(@dir).values.flatten.group_by { |r| r["pid"] }.transform_values { |rs| rs.sum { |r| r["answered"] } }
    assert_equal 2, writes.size, "both workers held polls: #{writes}"
    assert_equal CLIENTS, writes.values.sum
  end

  private

  def poll(client, last)
    body = "%2Fw=#{last}"
    socket = TCPSocket.new("127.0.0.1", @server.port)
    socket.write("POST /message-bus/#{client}/poll HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n" \
      "Content-Length: #{body.bytesize}\r\nDont-Chunk: t\r\n\r\n#{body}")
    socket
  end

  def read_reply(socket)
    raise "no reply within 10 s" unless socket.wait_readable(10)
    raw = socket.read.force_encoding(Encoding::UTF_8)
    raw.split("\r\n\r\n", 2).last
  end
end
