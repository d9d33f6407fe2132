# frozen_string_literal: true

require_relative "dashboard_helper"

# "Retry all" from a dashboard whose process does not load the subscriber's class: the request goes
# through the store and the subscriber's worker, in another process, runs each dead letter once.
module RemoteRetryTests
  include Herald::DashboardTestSupport

  COUNT = 200

  def test_retry_all_is_served_by_the_worker_in_another_process_each_once
    store = use_store(open_store)
    handled_path = File.join(@tmp, "handled")
    worker = fork_child { run_worker(handled_path) }
    COUNT.times { |n| bury("Remote", "/remote-old", boom("failed <#{n}>"), data: {"n" => n}) }
    Timeout.timeout(20) { sleep 0.05 until store.lease_holder("Remote") } # its worker is up
    response = post("/dead/retry", {"scope" => "filtered", "subscriber" => "Remote"})
    assert_match(/Asked Remote's worker to retry #{COUNT} dead letters/o, notice(response))
    started = monotonic
    dead = Herald::Events::DeadLetters.new(store)
    Timeout.timeout(20) { sleep 0.05 until dead.pending("Remote").empty? }
    served = monotonic - started
    post("/dead/retry", {"ids" => "Remote:1"}) # again: resolved, nothing runs
    sleep 2 * Herald::Events::Worker::REQUEST_CHECK
    handled = read_ids(handled_path)
    puts "\nremote retry (#{store_kind}): #{COUNT} dead letters retried by the worker in process #{worker} in #{served.round(2)} s; " \
      "handled #{handled.size}, distinct #{handled.uniq.size}"
    assert_equal (0...COUNT).to_a, handled.sort
    assert_includes get("/dead?subscriber=Remote")[2], "0 dead letters"
  ensure
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
    define_subscriber("Remote", "/remote", deferred: true) { |event, _| out.write("#{event["n"]}\n") }
    Herald.start_workers
    stop = Queue.new
    trap(:TERM) { stop << true }
    stop.pop
    Herald.shutdown(timeout: 5)
  end
end

class LogRemoteRetryTest < Minitest::Test
  include RemoteRetryTests

  def store_kind = "Log"

  def open_store = Herald::Store::Log.new(dir: File.join(@tmp, "log"), fsync: :never)
end

class RedisRemoteRetryTest < Minitest::Test
  include RemoteRetryTests

  def store_kind = "Redis"

  def open_store
    @namespace ||= "retry#{SecureRandom.hex(6)}"
    Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: @namespace, on_reset: ->(*) {})
  end
end
