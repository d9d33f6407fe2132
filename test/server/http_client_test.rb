# frozen_string_literal: true

require "test_helper"
require "message_bus"
require "message_bus/http_client"
require_relative "../support/spawned_server"

# message_bus's own Ruby client (MessageBus::HTTPClient, gem 4.5.1, unmodified) against a running
# `herald server`, in both of its modes.
class HTTPClientTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("herald-server")
    @server = Herald::SpawnedServer.start(dir: @dir)
    @clients = []
  end

  def teardown
    @clients.each(&:stop)
    # A client still reading its stream warns (EOFError) when the server goes away: expected here.
    status = nil
    capture_io { status = @server.stop }
    assert_predicate status, :success?, "the server should exit cleanly on SIGTERM"
    FileUtils.rm_rf(@dir)
  end

  def test_long_polling_receives_published_messages
    assert_receives(client(enable_chunked_encoding: false))
  end

  def test_chunked_streaming_receives_published_messages
    assert_receives(client(enable_chunked_encoding: true))
  end

  def test_subscribing_from_zero_replays_the_backlog_first
    2.times { |i| publish_form("backlog #{i}") }
    received = Queue.new
    client(enable_chunked_encoding: true).subscribe("/chat", last_message_id: 0) { |data, id| received << [data["text"], id] }
    assert_equal [["backlog 0", 1], ["backlog 1", 2]], Array.new(2) { pop(received) }
    publish_form("live")
    assert_equal ["live", 3], pop(received)
  end

  def test_messages_published_by_another_process_reach_a_streaming_client
    skip "herald publish writes Herald's log, not message_bus's" unless Herald::SpawnedServer.impl == "herald"
    received = Queue.new
    client = client(enable_chunked_encoding: true)
    client.subscribe("/chat") { |data, message_id| received << [data["text"], message_id] }
    channel = client.instance_variable_get(:@channels).fetch("/chat")
    eventually(message: "the client never got its first reply") { channel.last_message_id == 0 }
    id = @server.cli_publish("/chat", {"text" => "from herald publish"})
    assert_equal ["from herald publish", id], pop(received)
  end

  def test_sigint_stops_the_server_gracefully_with_clients_connected
    assert_receives(client(enable_chunked_encoding: true))
    status = nil
    capture_io { status = @server.stop(:INT) }
    assert_predicate status, :success?, "exit status after SIGINT: #{status.inspect}"
  end

  private

  def client(**options)
    MessageBus::HTTPClient.new(@server.url, min_poll_interval: 0.05, **options).tap { |c| @clients << c }
  end

  # Subscribes from now (-1), waits until the first poll is answered (the /__status position), then
  # expects each message published through the server's endpoint, in order, with its ids.
  def assert_receives(client)
    received = Queue.new
    client.subscribe("/chat") { |data, message_id, global_id| received << [data["text"], message_id, global_id] }
    # The reply to the first poll is a /__status with the channel's position (0): from then on the client
    # is parked on the server (streaming) or polls again from that position (long-polling).
    channel = client.instance_variable_get(:@channels).fetch("/chat")
    eventually(message: "the client never got its first reply") { channel.last_message_id == 0 }
    3.times do |i|
      id = publish_form("message #{i}")
      text, message_id, global_id = pop(received)
      assert_equal ["message #{i}", id], [text, message_id]
      assert_kind_of Integer, global_id
    end
  end

  def publish_form(text)
    response = @server.post("/chat", URI.encode_www_form(text: text, name: "ruby"),
      content_type: "application/x-www-form-urlencoded")
    assert_equal "201", response.code, response.body
    JSON.parse(response.body).fetch("message_id")
  end

  def pop(queue, timeout: 5)
    Timeout.timeout(timeout) { queue.pop }
  rescue Timeout::Error
    flunk("no message within #{timeout}s")
  end
end
