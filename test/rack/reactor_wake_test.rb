# frozen_string_literal: true

require_relative "rack_helper"

# The event loop reads the store itself, woken by the store (Store#watch), with no thread in between: before,
# a message went publishing thread -> the bus's dispatcher thread -> the loop, and from another process
# the log's listener thread -> dispatcher -> loop; each hand-off an OS wake-up and a GVL hand-off, which
# cost milliseconds apiece on busy cores. Also: no message lost or repeated when a publish races a park.
class ReactorWakeTest < Minitest::Test
  include Herald::RackHelpers

  def teardown
    super
    @log_bus&.close
    FileUtils.rm_rf(@dir) if @dir
  end

  def test_the_loop_reads_a_memory_store_without_the_dispatcher_thread
    assert_woken_without_a_dispatcher(@bus)
  end

  def test_the_loop_reads_a_log_without_the_dispatcher_thread
    assert_woken_without_a_dispatcher(log_bus)
  end

  # The store's listener thread is stopped: only the loop's own socket can bring another process's record in
  # (before, nothing did: the listener -> dispatcher -> loop path was the only one).
  def test_another_process_append_reaches_the_loop_through_its_own_socket
    bus = log_bus
    mw = middleware_on(bus)
    socket = puma(mw).request({"/x" => 0}, headers: {"Dont-Chunk" => "t"})
    parked(mw)
    bus.store.instance_variable_get(:@wakeup).instance_variable_get(:@thread).kill
    pid = fork do
      other = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir))
      other.publish("/x", "from another process ✓ \u0000 🎉")
      other.close
      exit!(0)
    end
    Process.wait(pid)
    status, _, body = Herald::PumaServer.read(socket, timeout: 3)
    assert_equal 200, status
    assert_equal [[1, "from another process ✓ \u0000 🎉"]], JSON.parse(body.force_encoding(Encoding::UTF_8)).map { |m| [m["message_id"], m["data"]] }
  end

  def test_no_message_lost_or_repeated_when_publishes_race_parks_memory
    assert_races_lose_nothing(@bus)
  end

  def test_no_message_lost_or_repeated_when_publishes_race_parks_log
    assert_races_lose_nothing(log_bus)
  end

  private

  def log_bus
    @dir = Dir.mktmpdir("herald-wake")
    @log_bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir))
  end

  def middleware_on(bus)
    Herald::Rack::Middleware.new(APP, bus: bus, long_polling_interval: 5).tap { |mw| @middlewares << mw }
  end

  def assert_woken_without_a_dispatcher(bus)
    mw = middleware_on(bus)
    server = puma(mw)
    before = Thread.list
    socket = server.request({"/w" => bus.last_id("/w")}, headers: {"Dont-Chunk" => "t"})
    parked(mw)
    bus.publish("/w", "héllo 🎉")
    status, _, body = Herald::PumaServer.read(socket)
    assert_equal [200, ["héllo 🎉"]], [status, JSON.parse(body.force_encoding(Encoding::UTF_8)).map { |m| m["data"] }]
    started = (Thread.list - before).select(&:alive?).filter_map(&:name).select { |n| n.start_with?("herald") }
    assert_equal ["herald-reactor"], started, "threads the poll and the publish started"
  end

  # Parks a poll at the channel's last id again and again while another thread publishes: every reply must
  # start right after its position and be gapless (a message appended between a poll's backlog read and its
  # park is caught up, never lost; one fanned out and caught up is sent once).
  def assert_races_lose_nothing(bus)
    seed = Integer(ENV.fetch("SEED", Random.new_seed % 1_000_000))
    random = Random.new(seed)
    mw = middleware_on(bus)
    server = puma(mw)
    stop = false
    publisher = Thread.new do
      i = 0
      until stop
        bus.publish("/race", "m#{i += 1} é")
        sleep random.rand(0.002)
      end
    end
    polls = 0
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 2
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      from = bus.last_id("/race")
      status, _, body = Herald::PumaServer.read(server.request({"/race" => from}, client: "c#{polls += 1}", headers: {"Dont-Chunk" => "t"}))
      ids = JSON.parse(body).map { |m| m["message_id"] }
      assert_equal 200, status, "SEED=#{seed}"
      refute_empty ids, "SEED=#{seed}: the poll from #{from} timed out: a message was lost"
      assert_equal (from + 1..from + ids.size).to_a, ids, "SEED=#{seed}: from #{from}"
    end
    assert_operator polls, :>, 20, "SEED=#{seed}"
  ensure
    stop = true
    publisher&.join
  end
end
