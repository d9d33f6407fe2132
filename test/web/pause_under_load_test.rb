# frozen_string_literal: true

require_relative "dashboard_helper"

# Pause a deferred subscriber from the dashboard while 100 events/s arrive, its worker in another process:
# lag grows while paused, resume drains it to 0, and every event is handled exactly once.
module PauseUnderLoadTests
  include Herald::DashboardTestSupport

  RATE = 100 # events per second

  def test_pause_under_load_then_resume_drains_with_no_event_lost_or_repeated
    use_store(open_store)
    handled_path = File.join(@tmp, "handled")
    define_subscriber("LoadCounter", "/load", deferred: true, start: :oldest) { |*| } # known here for the lag
    worker = fork_child { run_worker(handled_path) }
    publisher = publish_in_background
    wait_for("the worker to keep up") { lag == 0 && read_ids(handled_path).size >= 50 }
    assert_equal 303, post("/subscribers/pause", {"name" => "LoadCounter"})[0]
    paused_at = monotonic
    sleep Herald::Events::Worker::PAUSE_CHECK + 0.3 # the worker's next look at the flag
    handled_when_paused = read_ids(handled_path).size
    lag_when_paused = lag
    sleep 2
    lags = [lag_when_paused, lag]
    assert_equal handled_when_paused, read_ids(handled_path).size, "nothing handled while paused"
    assert_operator lags.last, :>=, lags.first + RATE, "lag grows by about #{RATE}/s while paused: #{lags.inspect}"
    assert_includes get("/subscribers")[2], "paused"
    assert_equal 303, post("/subscribers/resume", {"name" => "LoadCounter"})[0]
    sleep 1
    published = stop(publisher)
    drained = wait_for("the lag to drain to 0") { lag == 0 && read_ids(handled_path).size >= published.size }
    handled = read_ids(handled_path)
    puts "\npause under load (#{store_kind}): #{published.size} events at #{RATE}/s; paused #{(monotonic - paused_at).round(1)} s, lag " \
      "#{lags.first} -> #{lags.last} while paused; drained to 0 in #{drained.round(2)} s after the publisher stopped; " \
      "handled #{handled.size}, distinct #{handled.uniq.size}"
    assert_equal published.sort, handled.sort, "every event handled"
    assert_equal handled.uniq.size, handled.size, "none twice"
  ensure
    publisher&.kill
    if worker
      Process.kill(:TERM, worker)
      Process.wait(worker)
    end
  end

  private

  def run_worker(path)
    Herald.reset!
    Herald::Events.registry.clear
    Herald.configure { |c| c.store = open_store }
    out = File.open(path, "a")
    out.sync = true
    define_subscriber("LoadCounter", "/load", deferred: true, start: :oldest) { |_, m| out.write("#{m.global_id}\n") }
    Herald.start_workers
    stop = Queue.new
    trap(:TERM) { stop << true }
    stop.pop
    Herald.shutdown(timeout: 5)
  end

  def publish_in_background
    Thread.new do
      ids = []
      Thread.current[:ids] = ids
      start = monotonic
      n = 0
      until Thread.current[:stop]
        ids << Herald.bus.store.append("/load", Herald::Codec::Json.encode({"n" => n}), codec: Herald::Codec::Json).global_id
        n += 1
        delay = start + n.fdiv(RATE) - monotonic
        sleep delay if delay > 0
      end
      ids
    end
  end

  def stop(thread)
    thread[:stop] = true
    thread.value
  end

  # nil until the worker saved its first cursor
  def lag
    found = get("/subscribers")[2][%r{data-subscriber="LoadCounter">.*?<td class="num lag">(\d+)}m, 1]
    found && Integer(found)
  end

  def wait_for(what, timeout: 20)
    start = monotonic
    until yield
      flunk "timed out waiting for #{what}" if monotonic - start > timeout
      sleep 0.05
    end
    monotonic - start
  end
end

class LogPauseUnderLoadTest < Minitest::Test
  include PauseUnderLoadTests

  def store_kind = "Log"

  def open_store = Herald::Store::Log.new(dir: File.join(@tmp, "log"), fsync: :never)
end

class RedisPauseUnderLoadTest < Minitest::Test
  include PauseUnderLoadTests

  def store_kind = "Redis"

  def open_store
    @namespace ||= "pause#{SecureRandom.hex(6)}"
    Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: @namespace, on_reset: ->(*) {})
  end
end
