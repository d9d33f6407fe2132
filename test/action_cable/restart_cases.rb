# frozen_string_literal: true

require_relative "cable_helper"
require "stringio"

# Where ActionCable's Redis adapter wedges (rails/rails#27659, PR #51687): a Redis or PostgreSQL restart in
# the middle of a stream, and a server that stops answering. Each test uses a server of its own.
class CableRestartTest < Minitest::Test
  include Herald::CableTestSupport

  def setup
    @log = StringIO.new
    Herald.logger = Logger.new(@log)
  end

  def teardown
    Process.kill(:CONT, @server[:pid]) if @stopped
    shut_down_adapters
    Herald.logger = nil
  end

  # A Redis restart without persistence (everything gone, a new epoch): subscribers keep their place,
  # broadcasts made after the restart arrive, each once and in order, and the outage was logged by name.
  def test_subscribers_resume_after_a_redis_restart
    skip_unless_redis
    @server = Herald::TestServers.redis_server
    restarted(logged: true) { Herald::TestServers.restart_redis_server!(@server, down_for: 1) }
  end

  # PostgreSQL killed (no checkpoint) and started again: the same. (The store's own retries may cover the
  # outage, so the reader need not have failed.)
  def test_subscribers_resume_after_a_postgres_restart
    Herald::TestServers.require!(self, :postgres)
    @server = Herald::TestServers.postgres_server
    restarted(logged: false) { Herald::TestServers.crash_postgres_server!(@server) }
  end

  # A log directory replaced under the running process (a new epoch, ids from 1 again): the subscription goes
  # on with what is broadcast once its reader noticed, the reset is logged. Before, the reader waited for ids
  # above its old cursor: the first 200 broadcasts after the reset were never delivered.
  def test_subscribers_go_on_after_the_log_directory_is_replaced
    dir = store_setting(:log)
    cable = cable_server(store: dir)
    rx = cable.pubsub
    tx = cable.config.pubsub_adapter.new(cable)
    queue = subscribed_queue(rx, "stream")
    200.times { |i| tx.broadcast("stream", "before #{i}") }
    assert_equal Array.new(200) { |i| "before #{i}" }, Array.new(200) { pop(queue) }
    FileUtils.rm_rf(dir)
    FileUtils.mkdir_p(dir)
    fresh = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir), codec: :raw) # a process started after it
    channel = Herald::Cable.channel("stream")
    probes = 0
    eventually(timeout: 10, message: "nothing broadcast after the reset arrived") do
      fresh.publish(channel, "probe #{probes += 1}")
      sleep 0.2
      !queue.empty?
    end
    assert_operator probes, :<, 50, "the new store's ids stay far below the old cursor"
    5.times { |i| fresh.publish(channel, "after #{i}") }
    got = []
    got << pop(queue) until got.last == "after 4"
    assert_equal Array.new(5) { |i| "after #{i}" }, got.reject { |m| m.start_with?("probe") }
    assert_match(/the store was reset \(epoch \h+ -> \h+\)/, @log.string)
  ensure
    fresh&.close
  end

  # A stalled server (SIGSTOP): subscribe and unsubscribe return at once, ActionCable's event loop keeps
  # running, a new subscription is not confirmed until the server answers, and then it receives.
  def test_a_stalled_redis_never_blocks_the_event_loop
    skip_unless_redis
    @server = Herald::TestServers.redis_server
    cable = cable_server(store: @server[:url], timeout: 0.5)
    rx = cable.pubsub
    tx = cable.config.pubsub_adapter.new(cable)
    live = subscribed_queue(rx, "live")
    gone = ->(_) {}
    rx.subscribe("gone", gone)
    Process.kill(:STOP, @server[:pid])
    @stopped = true
    confirmed = Queue.new
    late = Queue.new
    assert_operator seconds { rx.subscribe("late", ->(m) { late << m }, -> { confirmed << true }) }, :<, 0.1
    assert_operator seconds { rx.unsubscribe("gone", gone) }, :<, 0.1
    ran = Queue.new
    assert_operator seconds { cable.event_loop.post { ran << true } && pop(ran, timeout: 1) }, :<, 1, "the event loop runs while the store is stalled"
    assert_raises(Herald::ConnectionError) { tx.broadcast("live", "during") } # on the broadcasting thread
    sleep 1
    assert_empty confirmed, "no success callback while the store cannot be read"
    Process.kill(:CONT, @server[:pid])
    @stopped = false
    pop(confirmed)
    tx.broadcast("late", "after")
    tx.broadcast("live", "after")
    assert_equal "after", pop(late)
    assert_equal "after", pop(live)
    assert_match(/Herald::(Timeout|Connection)Error/, @log.string)
  end

  private

  def skip_unless_redis = Herald::TestServers.require!(self, :redis)

  def restarted(logged:)
    cable = cable_server(store: @server[:url])
    rx = cable.pubsub
    tx = cable.config.pubsub_adapter.new(cable)
    queue = subscribed_queue(rx, "stream ✓")
    3.times { |i| tx.broadcast("stream ✓", "before #{i}") }
    assert_equal Array.new(3) { |i| "before #{i}" }, Array.new(3) { pop(queue) }
    yield
    # The reader notices the restart on its own: probe until one arrives, then a sequence that must
    # arrive whole.
    probes = 0
    eventually(timeout: 30, message: "no broadcast arrived after the restart") do
      retrying(timeout: 30) { tx.broadcast("stream ✓", "probe #{probes += 1}") }
      sleep 0.2
      !queue.empty?
    end
    5.times { |i| tx.broadcast("stream ✓", "after #{i}") }
    got = []
    got << pop(queue) until got.last == "after 4"
    got.reject! { |m| m.start_with?("probe") }
    assert_equal Array.new(5) { |i| "after #{i}" }, got, "after the restart: each once, in order"
    return unless logged
    assert_match(/reading broadcasts failed: Herald::(Connection|Timeout)Error/, @log.string)
    assert_match(/reading broadcasts again after \d+ failure/, @log.string)
  end

  def seconds
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end
end
