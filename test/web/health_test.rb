# frozen_string_literal: true

require_relative "web_helper"
require_relative "../events/events_helper"

# Herald::Web::Health turns 503 when a threshold is crossed and 200 again after, with the reasons.
class HealthTest < Minitest::Test
  include Herald::EventsTestSupport
  include Herald::WebTestSupport

  MB = 1024 * 1024

  def health_for(**options) = Herald::Web::Health.new(bus: Herald.bus, **options)

  def test_healthy_with_no_threshold_set
    use_store(log_store)
    status, body = health(health_for)
    assert_equal 200, status
    assert_equal({"status" => "ok", "reasons" => [], "checks" => {"store" => "ok"}}, body)
  end

  # The threshold against the real free space of the log's directory.
  def test_disk_threshold_flips_503_and_back
    store = use_store(log_store)
    free = Herald::Web::Health.free_bytes(store.data_dir)
    assert_operator free, :>, 0
    app = health_for(disk_free_min: free / 2)
    status, body = health(app)
    assert_equal 200, status, body.inspect
    assert_in_delta free, body["checks"]["disk_free_bytes"], 256 * MB # the machine is shared: others write
    app.disk_free_min = free + 1024 * MB
    status, body = health(app)
    assert_equal 503, status
    assert_equal "fail", body["status"]
    assert_match(/\Adisk: \d+ bytes free under #{Regexp.escape(store.data_dir)}, below disk_free_min #{free + 1024 * MB}\z/, body["reasons"].join)
    app.disk_free_min = free / 2
    assert_equal 200, health(app).first
  end

  # Free space actually taken: a file of 256 MB written under the directory crosses a threshold set 128 MB
  # below what was free, deleting it brings it back (retried: other engineers' processes share the disk).
  def test_filling_the_disk_flips_503_and_back
    store = use_store(log_store)
    dir = store.data_dir
    trials = []
    3.times do
      app = health_for(disk_free_min: Herald::Web::Health.free_bytes(dir) - 128 * MB)
      before = health(app).first
      File.open(File.join(dir, "filler"), "wb") do |f|
        chunk = "\xAB".b * MB
        256.times { f.write(chunk) }
        f.fsync
      end
      full = health(app)
      File.delete(File.join(dir, "filler"))
      after = health(app).first
      trials << [before, full.first, after]
      break if trials.last == [200, 503, 200]
    end
    assert_equal [200, 503, 200], trials.last, "trials #{trials.inspect}"
  ensure
    FileUtils.rm_f(File.join(dir, "filler")) if dir
  end

  # Lag from the cursor in the store: the workers stopped, events published beyond the cursor make it 503
  # (here and in another process opening the same log); workers started again drain it to 200.
  def test_subscriber_lag_flips_503_and_back
    use_store(log_store)
    handled = Queue.new
    define_subscriber("Mailer", "/orders", deferred: true) { |event, _| handled << event["n"] }
    Herald.start_workers
    5.times { |i| Herald.publish_event({"n" => i, "text" => "héllo 👋"}, channel: "/orders") }
    eventually { handled.size == 5 }
    app = health_for(lag_max: 10)
    eventually { caught_up?(app, "Mailer") } # the cursor is saved within SAVE_EVERY
    status, body = health(app)
    assert_equal 200, status
    assert_equal({"cursor" => Herald.bus.store.last_global_id, "lag_messages" => 0, "lag_seconds" => 0.0}, body["checks"]["subscribers"]["Mailer"])

    stop_workers # the cursor stays where it was saved
    20.times { |i| Herald.publish_event({"n" => 5 + i}, channel: "/orders") }
    status, body = health(app)
    assert_equal 503, status
    assert_equal ["Mailer: 20 messages behind, over lag_max 10"], body["reasons"]
    assert_equal 20, body["checks"]["subscribers"]["Mailer"]["lag_messages"]
    assert_equal [503, ["Mailer: 20 messages behind, over lag_max 10"]], health_in_another_process(@tmp)
    metrics = scrape(Herald::Web::Metrics.new(bus: Herald.bus))
    assert_equal 20, metrics['herald_subscriber_lag_messages{subscriber="Mailer"}']
    assert_operator metrics['herald_subscriber_lag_seconds{subscriber="Mailer"}'], :>, 0

    Herald.start_workers
    eventually { caught_up?(app, "Mailer") }
    assert_equal 200, health(app).first
    assert_equal (0...25).to_a, Array.new(handled.size) { handled.pop }, "each event handled once, in order"
  end

  # Seconds behind: the oldest message after the cursor has waited longer than lag_seconds_max.
  def test_lag_in_seconds
    use_store(log_store)
    define_subscriber("Audit", "/audit", deferred: true) { |_, _| nil }
    Herald.start_workers
    Herald.publish_event({"n" => 0}, channel: "/audit")
    app = health_for(lag_seconds_max: 0.3)
    eventually { caught_up?(app, "Audit") }
    stop_workers
    Herald.publish_event({"n" => 1}, channel: "/audit")
    assert_equal 200, health(app).first
    sleep 0.4
    status, body = health(app)
    assert_equal 503, status, body.inspect
    assert_match(/\AAudit: 0\.\d+ s behind, over lag_seconds_max 0\.3\z/, body["reasons"].join)
  end

  # A handler that hangs holds the lease: the cursor stands still with messages after it.
  def test_stuck_lease
    use_store(log_store)
    gate = Queue.new
    define_subscriber("Hangs", "/hang", deferred: true) { |_, _| gate.pop }
    Herald.start_workers
    3.times { |i| Herald.publish_event({"n" => i}, channel: "/hang") }
    app = health_for(stuck_after: 0.3)
    # First sight of its cursor (saved when its worker took the lease): not stuck yet.
    eventually { health(app).last.dig("checks", "subscribers", "Hangs", "cursor") }
    assert_equal 200, health(app).first
    sleep 0.5
    status, body = health(app)
    assert_equal 503, status
    assert_match(/\AHangs: lease stuck, its cursor \d+ has not moved for 0\.\d s with [1-3] messages after it\z/, body["reasons"].join)
    3.times { gate << :go }
    eventually { health(app).first == 200 }
  end

  def test_unreachable_store
    bus = Herald::Bus.new(store: Herald::Store::Redis.new(url: "redis://127.0.0.1:#{closed_port}/0", connect_timeout: 0.2, timeout: 0.2))
    status, body = health(Herald::Web::Health.new(bus: bus, subscribers: []))
    assert_equal 503, status
    assert_match(/\Astore unreachable: Herald::\w*Error/, body["reasons"].join)
  ensure
    bus&.close
  end

  def teardown
    Herald::Events.autostart = true
    super
  end

  private

  # As a process whose workers stopped: publishing does not start them again.
  def stop_workers
    Herald::Events.reset_runtime!
    Herald::Events.autostart = false
  end

  def caught_up?(app, name)
    lag = health(app).last.dig("checks", "subscribers", name)
    lag["cursor"] && lag["lag_messages"] == 0
  end

  def closed_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1].tap { server.close }
  end

  # [status, reasons] from a forked child opening the same log directory.
  def health_in_another_process(tmp)
    reader, writer = IO.pipe
    pid = fork_child do
      reader.close
      bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: File.join(tmp, "log"), fsync: :never))
      status, _, body = Herald::Web::Health.new(bus: bus, lag_max: 10, subscribers: ["Mailer"]).call({})
      writer.write(JSON.generate([status, JSON.parse(body.join)["reasons"]]))
      writer.close
    end
    writer.close
    result = JSON.parse(reader.read)
    Process.wait(pid)
    assert $?.success?
    result
  ensure
    reader&.close
  end
end
