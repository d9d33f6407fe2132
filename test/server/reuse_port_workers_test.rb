# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require "socket"
require "timeout"
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

  # Published by a third process (`herald publish` on the same log): every worker learns of it through the
  # log's cross-process wakeup, whichever holds the poll.
  def test_one_publish_reaches_polls_parked_on_both_workers
    data = "héllo 🎉 #{"x" * 100}"
    last = @server.cli_publish("/w", "first")
    @sockets = Array.new(CLIENTS) { |i| poll("w#{i}", last) }
    sleep 2 # every poll parked (nothing tells from outside which worker holds which)
    @server.cli_publish("/w", {"t" => 1, "s" => data})
    replies = @sockets.map { |s| read_reply(s) }
    replies.each { |body| assert_equal [{"t" => 1, "s" => data}], JSON.parse(body).map { |m| m["data"] } }
    # Fanned out by the workers' event loops (not answered from a backlog): both wrote their share.
    writes = Bench::FanOutTrace.collect(@dir).values.flatten.group_by { |r| r["pid"] }.transform_values { |rs| rs.sum { |r| r["answered"] } }
    assert_equal CLIENTS, writes.values.sum, "every poll was parked and fanned out: #{writes}"
    assert_equal 2, writes.size, "both workers held polls: #{writes}"
  end

  # The real command: `herald server --workers 2`. A worker that dies takes the server down (exit 1)
  # rather than leaving its share of the port unanswered.
  def test_herald_server_workers_and_a_dying_worker
    dir = Dir.mktmpdir("herald-workers-cli")
    cli = Herald::SpawnedServer.new(Herald::SpawnedServer.herald_command(dir) + ["--workers", "2"], dir: dir)
    pids = cli.output[/2 worker processes: (\d+, \d+)/, 1].split(", ").map { |pid| Integer(pid) }
    @sockets = Array.new(10) { |i| poll("cli#{i}", 0, port: cli.port) }
    sleep 1
    cli.post("/message-bus/x/poll?dlp=t", "") # any request: the server answers
    Process.kill(:KILL, pids.first)
    _, status = Timeout.timeout(20) { Process.wait2(cli.pid) } # it stops by itself
    exited = true
    assert_equal 1, status.exitstatus, cli.output
    assert_raises(Errno::ESRCH) { Process.kill(0, pids.last) }
  ensure
    cli&.stop unless exited
    FileUtils.rm_rf(dir)
  end

  private

  def poll(client, last, port: @server.port)
    body = "%2Fw=#{last}"
    socket = TCPSocket.new("127.0.0.1", port)
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
