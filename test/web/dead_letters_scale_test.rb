# frozen_string_literal: true

require_relative "dashboard_helper"

# 10,000 dead letters: page 1 renders fast, "Retry all" handles each event exactly once.
class DeadLettersScaleTest < Minitest::Test
  include Herald::DashboardTestSupport

  COUNT = 10_000
  PAGE_BUDGET = 0.2 # seconds for page 1 (the issue's figure)

  def test_retry_all_on_10_000_dead_letters_handles_each_once
    store = use_store(log_store)
    handled = Hash.new(0)
    define_subscriber("Bulk", "/bulk", deferred: true) { |event, _| handled[event["n"]] += 1 }
    dead = Herald::Events::DeadLetters.new(store)
    error = boom("timeout talking to <smtp>")
    COUNT.times do |n|
      msg = store.append("/bulk", Herald::Codec::Json.encode({"n" => n, "text" => "é 🎉"}), codec: Herald::Codec::Json)
      dead.bury("Bulk", msg, error, 3)
    end
    get("/dead") # the CSRF cookie, and a warm process
    timings = 5.times.map { timed { assert_page(get("/dead"), "#{COUNT} dead letters", "page 1 of #{COUNT / 50}") } }
    filtered = timed { assert_page(get("/dead?subscriber=Bulk&error=ArgumentError"), "#{COUNT} dead letters") }
    response = nil
    retry_time = timed { response = post("/dead/retry", {"scope" => "filtered", "subscriber" => "Bulk"}) }
    after = timed { assert_page(get("/dead"), "0 dead letters") }
    puts "\n#{COUNT} dead letters: page 1 in #{ms(timings.min)}-#{ms(timings.max)} ms (median #{ms(timings.sort[2])}), " \
      "filtered page 1 #{ms(filtered)} ms; Retry all #{ms(retry_time)} ms (#{notice(response)}); page after #{ms(after)} ms"
    assert_equal COUNT, handled.size, "every event handled"
    assert_equal [1], handled.values.uniq, "each once"
    assert_operator timings.sort[2], :<, PAGE_BUDGET, "page 1 of #{COUNT} in under #{PAGE_BUDGET * 1000} ms (median)"
    post("/dead/retry", {"scope" => "filtered", "subscriber" => "Bulk"})
    assert_equal [1], handled.values.uniq, "a second Retry all finds nothing to run"
  end

  private

  def timed
    start = monotonic
    yield
    monotonic - start
  end

  def ms(seconds) = (seconds * 1000).round(1)
end
