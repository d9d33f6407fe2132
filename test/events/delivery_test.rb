# frozen_string_literal: true

require_relative "events_helper"

# Deferred delivery in one process: after the event is durable, retries with backoff, dead letters, replay.
class DeliveryTest < Minitest::Test
  include Herald::EventsTestSupport

  Charge = Struct.new(:amount, keyword_init: true)

  def test_deferred_subscribers_run_on_workers_in_order_and_save_their_cursor
    store = use_store(log_store)
    got = Queue.new
    define_subscriber("Mailer", UserRegistered, deferred: true) { |e, m| got << [e.user_id, m.global_id, Thread.current] }
    ids = (1..50).map { |i| Herald.publish_event(UserRegistered.new(user_id: i)) }
    Herald.publish_event(OrderPlaced.new(1, 2)) # not subscribed: skipped, cursor still moves
    handled = Array.new(50) { got.pop }
    assert_equal (1..50).to_a, handled.map(&:first)
    assert_equal (1..50).to_a, ids
    refute_includes handled.map(&:last), Thread.current
    eventually { store.load_cursor("Mailer") == 51 }
  end

  # The publish that starts the workers is handled; what came before the subscriber existed is not
  # (test/events/start_test.rb: start: :oldest, restarts).
  def test_a_deferred_subscriber_declared_after_the_first_publish_still_starts_from_then
    use_store(log_store)
    Herald.publish_event(UserRegistered.new(user_id: 1))
    got = Queue.new
    define_subscriber("Late", UserRegistered, deferred: true) { |e, _m| got << e.user_id }
    Herald.publish_event(UserRegistered.new(user_id: 2))
    Herald.publish_event(UserRegistered.new(user_id: 3))
    assert_equal [2, 3], [got.pop, got.pop], "a new subscriber starts with the publish that started it"
    sleep 0.1
    assert got.empty?, "event 1 was published before the subscriber existed"
  end

  def test_the_memory_store_serves_deferred_subscribers_in_batches_too
    store = use_store(Herald::Store::Memory.new)
    got = []
    define_subscriber("Mem", Numbered, deferred: true) { |e, _m| got << e.n }
    3000.times { |i| Herald.publish_event(Numbered.new(i + 1)) }
    eventually { got.size == 3000 }
    assert_equal (1..3000).to_a, got
    eventually { store.load_cursor("Mem") == 3000 }
  end

  def test_a_handler_that_fails_three_times_then_succeeds_is_retried_with_backoff
    use_store(log_store)
    calls = []
    retries = []
    sub = Herald::Instrumentation.subscribe("retry.herald") { |_n, p, _d| retries << [p[:attempt], p[:wait]] }
    define_subscriber("Flaky", UserRegistered, deferred: true, retry_on: {attempts: 5, wait: 0.02}) do |e, _m|
      calls << [e.user_id, Process.clock_gettime(Process::CLOCK_MONOTONIC)]
      raise IOError, "smtp down" if calls.size <= 3
    end
    log = capture_log do
      Herald.publish_event(UserRegistered.new(user_id: 9))
      eventually { calls.size == 4 }
    end
    assert_equal 3, log.scan(/^WARN: deferred subscriber Flaky failed .* retrying .*: IOError: smtp down/).size, log
    assert_equal [[1, 0.02], [2, 0.04], [3, 0.08]], retries
    gaps = calls.each_cons(2).map { |(_, a), (_, b)| b - a }
    gaps.zip([0.02, 0.04, 0.08]).each { |gap, wait| assert_operator gap, :>=, wait * 0.9 }
    sleep 0.1
    assert_equal 4, calls.size
    assert_empty Herald.dead_letters.list
  ensure
    Herald::Instrumentation.unsubscribe(sub) if sub
  end

  def test_a_handler_that_always_fails_lands_in_the_dead_letter_channel_and_the_cursor_moves_on
    store = use_store(log_store)
    handled = Queue.new
    define_subscriber("Billing", Charge, deferred: true, retry_on: {attempts: 3, wait: 0.005}) do |e, _m|
      raise ArgumentError, "card declined" if e.amount == 13
      handled << e.amount
    end
    log = capture_log do |io|
      Herald.publish_event(Charge.new(amount: 13))
      Herald.publish_event(Charge.new(amount: 14))
      assert_equal 14, handled.pop
      eventually { io.string.include?("gave up") }
    end
    # The issue: "lands in the dead letters with nothing logged".
    assert_equal 2, log.scan(/^WARN: deferred subscriber Billing failed on \/events\/delivery_test\/charge #1 \(attempt [12] of 3\), retrying in .*: ArgumentError: card declined \(.*delivery_test.rb:\d+/).size, log
    assert_match(%r{^ERROR: deferred subscriber Billing gave up on /events/delivery_test/charge #1 after 3 attempts: ArgumentError: card declined .*; dead letter /herald/dead/Billing #1}, log)
    letters = Herald.dead_letters.list
    assert_equal 1, letters.size
    letter = letters.first
    assert_equal ["Billing", 1, "ArgumentError", "card declined", 3], [letter.subscriber, letter.global_id, letter.error, letter.error_message, letter.attempts]
    assert_equal "/herald/dead/Billing", Herald.global_backlog(0).find { |m| m.channel.start_with?("/herald/dead/") }.channel
    assert_equal Charge.new(amount: 13), letter.message.data
    eventually { store.load_cursor("Billing") >= 2 }
  end

  def test_replay_runs_the_handler_again_on_dead_letters
    use_store(log_store)
    fixed = false
    replayed = []
    sub = define_subscriber("Billing", Charge, deferred: true) do |e, m|
      raise "not yet" unless fixed
      replayed << [e.amount, m.global_id]
    end
    capture_log do |io|
      Herald.publish_event(Charge.new(amount: 1))
      Herald.publish_event(Charge.new(amount: 2))
      eventually { io.string.scan("gave up").size == 2 }
    end
    fixed = true
    results = Herald.dead_letters.replay(sub, from: 2)
    assert_equal [[2, nil]], results.map { |l, e| [l.id, e] }
    assert_equal [[2, results.first.first.global_id]], replayed, "the handler gets the original message"
  end

  def test_cli_lists_dead_letters_and_replays_them_with_the_apps_classes
    dir = File.join(@tmp, "cli")
    store = use_store(log_store(dir))
    require_relative "fixtures/replay_app"
    ChargeCard.retry_on(StandardError, attempts: 1)
    broken = File.join(@tmp, "missing", "out") # the handler fails: no such directory
    ENV["REPLAY_OUT"] = broken
    capture_log do |io|
      Herald.publish_event(::Charge.new(amount: 5))
      eventually { io.string.include?("gave up") }
    end
    Herald.reset!

    out, status = herald("dead", "--dir", dir)
    assert status.success?, out
    assert_match(%r{ChargeCard #1: /events/charge global_id=1 after 1 attempts: Errno::ENOENT}, out)

    replay_out = File.join(@tmp, "replayed")
    out, status = herald("replay", "ChargeCard", "--from", "1", "-r", File.expand_path("fixtures/replay_app.rb", __dir__), "--dir", dir, env: {"REPLAY_OUT" => replay_out})
    assert status.success?, out
    assert_match(/1 replayed, 0 failed/, out)
    assert_equal "1:5\n", File.read(replay_out)
  ensure
    store&.close
    ENV.delete("REPLAY_OUT")
  end
end
