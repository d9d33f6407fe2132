# frozen_string_literal: true

require_relative "../events/events_helper"
require_relative "../rack/rack_helper"
require "herald/test_helper"

# What the Railtie relies on, tested without Rails: reloaded subscribers replace their old class, handlers
# run inside Events.handler_wrapper, publish_event need not start workers, the middleware builds no bus
# until a request and follows Herald.reset!, and the default store survives a reset.
class RailsIntegrationPointsTest < Minitest::Test
  include Herald::EventsTestSupport

  def teardown
    Herald::Events.handler_wrapper = nil
    Herald::Events.reload_check = nil
    Herald::Events.autostart = true
    Herald::Config.default_store = nil
    super
  end

  # A class defined again under the same constant name, as Zeitwerk does after an edit.
  def reload_subscriber(name, *targets, deferred: false, &call)
    klass = Class.new { include Herald::Subscriber }
    klass.define_singleton_method(:name) { name }
    klass.define_method(:call, &call)
    klass.deferred if deferred
    klass.subscribe_to(*targets)
    klass
  end

  def test_a_reloaded_sync_subscriber_replaces_the_old_class
    use_store(Herald::Store::Memory.new)
    calls = []
    3.times { |version| reload_subscriber("ChatLogger", "/chat") { |event, _| calls << [version, event["t"]] } }
    Herald.publish_event({"t" => "héllo 👋"}, channel: "/chat")
    assert_equal [[2, "héllo 👋"]], calls
    assert_equal 1, Herald::Events.registry.subscribers.count { |s| s.name == "ChatLogger" }
  end

  def test_a_running_deferred_worker_calls_the_reloaded_code
    use_store(log_store)
    seen = Queue.new
    reload_subscriber("Mailer", "/orders", deferred: true) { |event, _| seen << [:old, event] }
    Herald.start_workers
    Herald.publish_event({"n" => 1}, channel: "/orders")
    assert_equal [:old, {"n" => 1}], Timeout.timeout(5) { seen.pop }
    reload_subscriber("Mailer", "/orders", deferred: true) { |event, _| seen << [:new, event] }
    Herald.publish_event({"n" => "ü"}, channel: "/orders")
    assert_equal [:new, {"n" => "ü"}], Timeout.timeout(5) { seen.pop }
    sleep 0.1
    assert seen.empty?, "no duplicate: #{seen.size} more calls"
  end

  # Development: a new file in app/subscribers. The pool's reload check (what the Railtie sets: reloader,
  # to_prepare, eager_load_dir) declares the class; the running workers adopt it. It handles what was
  # published from the last check before it appeared on, not what came earlier; the pool ran with no
  # deferred subscriber at all before.
  def test_a_new_deferred_subscriber_file_is_picked_up_by_the_running_workers
    use_store(log_store)
    seen = Queue.new
    file_added = false
    checks = 0
    Herald::Events.reload_check = lambda do
      checks += 1
      reload_subscriber("NewFile", "/orders", deferred: true) { |event, _| seen << event["n"] } if file_added && !defined?(@added)
      @added = true if file_added
    end
    Herald.start_workers
    assert Herald::Events.runtime.running?, "a pool that can reload runs with no subscriber yet"
    Herald.publish_event({"n" => 1}, channel: "/orders")
    eventually { checks >= 2 } # the check after event 1: it was there before the file
    file_added = true
    Herald.publish_event({"n" => "ü 2"}, channel: "/orders") # after the file, before the reload saw it
    assert_equal "ü 2", Timeout.timeout(5) { seen.pop }
    Herald.publish_event({"n" => 3}, channel: "/orders")
    assert_equal 3, Timeout.timeout(5) { seen.pop }
    sleep 0.2
    assert seen.empty?, "event 1 came before the subscriber existed"
  end

  # A class declared late (required after the workers started) joins on the next publish_event.
  def test_a_deferred_subscriber_declared_while_workers_run_joins_them
    use_store(log_store)
    seen = Queue.new
    reload_subscriber("First", "/a", deferred: true) { |event, _| seen << [:first, event] }
    Herald.start_workers
    reload_subscriber("Second", "/b", deferred: true) { |event, _| seen << [:second, event] }
    Herald.publish_event("é", channel: "/b")
    Herald.publish_event("ü", channel: "/a")
    got = Array.new(2) { Timeout.timeout(5) { seen.pop } }
    assert_equal [[:first, "ü"], [:second, "é"]], got.sort_by(&:first)
    assert_equal %w[First Second], Herald::Events.runtime.workers.map(&:name)
  end

  def test_handlers_run_inside_the_wrapper
    use_store(log_store)
    seen = Queue.new
    Herald::Events.handler_wrapper = lambda do |deferred:, &block|
      Thread.current[:herald_wrapped] = deferred
      block.call
    ensure
      Thread.current[:herald_wrapped] = nil
    end
    define_subscriber("SyncOne", "/w") { |_, _| seen << [:sync, Thread.current[:herald_wrapped]] }
    define_subscriber("DeferredOne", "/w", deferred: true) { |_, _| seen << [:deferred, Thread.current[:herald_wrapped]] }
    Herald.start_workers
    Herald.publish_event({"x" => 1}, channel: "/w")
    got = Array.new(2) { Timeout.timeout(5) { seen.pop } }
    assert_equal [[:deferred, true], [:sync, false]], got.sort
  end

  def test_publish_event_starts_no_worker_when_autostart_is_off
    use_store(log_store)
    Herald::Events.autostart = false
    define_subscriber("Lazy", "/lazy", deferred: true) { |_, _| nil }
    Herald.publish_event({"x" => 1}, channel: "/lazy")
    refute Herald::Events.runtime.running?
    assert_equal [], Dir.glob(File.join(@tmp, "log", "**", "*Lazy*")), "no lease, no cursor"
    Herald.start_workers
    assert Herald::Events.runtime.running?
  end

  def test_the_middleware_opens_nothing_until_a_request_and_follows_reset
    Herald::Config.default_store = File.join(@tmp, "lazy")
    mw = Herald::Rack::Middleware.new(->(_) { [200, {}, ["app"]] }, long_polling_enabled: false)
    refute File.exist?(File.join(@tmp, "lazy")), "building the middleware opened the store"
    first = Herald.bus
    assert File.directory?(File.join(@tmp, "lazy"))
    Herald.reset!
    Herald.configure { |c| c.store = :memory }
    Herald.publish("/chat", {"text" => "après reset ✓"})
    status, _, body = mw.call(Rack::MockRequest.env_for("/message-bus/c1/poll", method: "POST", input: "/chat=0"))
    assert_equal 200, status
    assert_includes JSON.parse(body.each.to_a.join).map { |m| m["data"] }, {"text" => "après reset ✓"}
    refute_same first, mw.bus
    mw.close
  end

  # Herald.reset! in a running app (a test suite switching stores): a client parked on the old bus is ended
  # (`[]`, so it polls again), and the next long poll is parked on the new bus and gets its messages live.
  def test_reset_moves_parked_long_polls_to_the_new_bus
    Herald.configure { |c| c.store = :memory }
    mw = Herald::Rack::Middleware.new(->(_) { [200, {}, ["app"]] }, long_polling_interval: 10)
    long_poll = lambda do |last_id|
      Thread.new do
        env = Rack::MockRequest.env_for("/message-bus/c1/poll", :method => "POST", :input => "/chat=#{last_id}", "HTTP_DONT_CHUNK" => "1")
        _, _, body = mw.call(env)
        text = +""
        body.each { |part| text << part }
        body.close if body.respond_to?(:close)
        JSON.parse(text)
      end
    end
    old_bus = Herald.bus
    before = long_poll.call(0)
    eventually { mw.active_clients == 1 }
    Herald.reset!
    Herald.configure { |c| c.store = :memory }
    after = long_poll.call(0)
    assert_equal [], Timeout.timeout(5) { before.value }, "the old bus's client is ended, not left hanging"
    eventually { mw.active_clients == 1 }
    refute_same old_bus, Herald.bus
    assert_same Herald.bus, mw.reactor.bus
    Herald.publish("/chat", {"text" => "après reset ✓ 🎉"})
    assert_equal [{"text" => "après reset ✓ 🎉"}], Timeout.timeout(5) { after.value }.map { |m| m["data"] }
  ensure
    mw&.close
  end

  def test_default_store_survives_reset
    Herald::Config.default_store = :memory
    Herald.reset!
    assert_kind_of Herald::Store::Memory, Herald.bus.store
  end
end

# Herald::TestHelper in a Minitest class, as an app's test suite includes it.
class HeraldTestHelperTest < Minitest::Test
  include Herald::TestHelper

  def teardown = Herald.reset!

  def test_each_test_gets_an_empty_memory_store
    assert_kind_of Herald::Store::Memory, Herald.bus.store
    assert_equal 0, Herald.bus.store.last_global_id
    Herald.publish("/left-over", {"x" => 1})
  end

  def test_assert_published_and_capture
    data = {"text" => "日本語 🎉 \u0000 end", "empty" => ""}
    messages = capture_published { Herald.publish("/chat", data, user_ids: [7]) }
    assert_equal [["/chat", data, [7]]], messages.map { |m| [m.channel, m.data, m.user_ids] }
    assert_published("/chat", data)
    assert_published("/other") { Herald.publish("/other", {"n" => 1}) }
    refute_published("/nothing")
    error = assert_raises(Minitest::Assertion) { assert_published("/chat", {"text" => "absent"}) }
    assert_includes error.message, "日本語"
    assert_raises(Minitest::Assertion) { refute_published("/chat") }
  end
end
