# frozen_string_literal: true

require_relative "dashboard_helper"

module Herald
  # Every page and action of Herald::Web at the Rack level, on the store `build_web_store` returns.
  module DashboardTests
    include DashboardTestSupport

    def setup
      super
      use_store(build_web_store)
    end

    def store = Herald.bus.store

    def test_every_page_renders_with_user_values_escaped
      Herald.publish(NASTY, {"text" => "<script>alert('x')</script> 日本 \u0000 🎉"})
      bury("Mailer <script>alert('x')</script>", NASTY, boom("<script>alert('x')</script>"))
      assert_equal 303, get("/")[0]
      body = assert_page(get("/subscribers"), "Mailer &lt;script&gt;")
      assert_includes body, "<td class=\"num\"><a href="
      assert_page(get("/dead"), "ArgumentError", "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;")
      assert_page(get("/channels"), "/chat &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; é 🎉")
      body = assert_page(get("/channel?name=#{URI.encode_www_form_component(NASTY)}"), "日本", "Live tail", "Retained messages")
      assert_includes body, "data-channel=\"/chat &lt;script&gt;"
      assert_page(get("/store"), store.stats["kind"], store.epoch)
      status, headers, js = get("/herald.js")
      assert_equal 200, status
      assert_match %r{javascript}, headers["content-type"]
      assert_includes js, "Herald browser client"
      assert_equal 404, get("/nope")[0]
    end

    def test_post_without_the_csrf_token_is_refused
      Herald.publish("/a", 1)
      status, _, body = post("/subscribers/pause", {"name" => "Sub"}, token: false)
      assert_equal 403, status
      assert_includes body, "CSRF"
      get("/store") # a cookie, but no token in the form
      assert_equal 403, request("POST", "/subscribers/pause", params: {"name" => "Sub"})[0]
      assert_equal 403, request("POST", "/subscribers/pause", params: {"name" => "Sub", "csrf" => "0" * 32})[0]
      refute store.paused?("Sub")
      status, headers, = post("/subscribers/pause", {"name" => "Sub"})
      assert_equal 303, status
      assert_equal "/herald/subscribers", headers["location"].split("?").first
      assert store.paused?("Sub")
    end

    def test_a_post_from_another_origin_is_refused
      get("/store")
      params = {"name" => "Sub", "csrf" => @cookies[Web::Csrf::COOKIE]}
      status, = request("POST", "/subscribers/pause", params: params, headers: {"HTTP_ORIGIN" => "http://evil.example", "HTTP_HOST" => "example.org"})
      assert_equal 403, status
      refute store.paused?("Sub")
    end

    def test_a_signed_cookie_is_needed_when_a_secret_is_set
      Herald::Web.secret = "s3cret"
      @cookies[Web::Csrf::COOKIE] = "a" * 32 # planted, unsigned
      status, = request("POST", "/subscribers/pause", params: {"name" => "Sub", "csrf" => "a" * 32})
      assert_equal 403, status
      @cookies.clear
      assert_equal 303, post("/subscribers/pause", {"name" => "Sub"})[0]
      assert_includes @cookies[Web::Csrf::COOKIE], "."
    end

    def test_read_only_refuses_every_action
      Herald::Web.read_only = true
      bury("Sub", "/a", boom)
      post_paths = Web::ROUTES.keys.filter_map { |(method, path)| path if method == "POST" }
      post_paths.each do |path|
        status, _, body = post(path, {"name" => "Sub", "ids" => "Sub:1", "scope" => "filtered", "data" => "1", "id" => "1"})
        assert_equal 403, status, path
        assert_includes body, "read-only"
      end
      refute store.paused?("Sub")
      assert_equal 1, Events::DeadLetters.new(store).pending("Sub").size
      assert_equal 0, store.last_id("1")
      body = assert_page(get("/dead"), "read-only")
      refute_includes body, "<form class=\"inline\" method=\"post\""
    end

    def test_basic_auth_in_front_shows_nothing_without_credentials
      Herald::Web.use ::Rack::Auth::Basic, "herald" do |user, password|
        user == "ops" && password == "pw"
      end
      status, _, body = get("/subscribers")
      assert_equal 401, status
      refute_includes body, "Subscribers"
      auth = "Basic #{["ops:pw"].pack("m0")}"
      assert_equal 200, get("/subscribers", headers: {"HTTP_AUTHORIZATION" => auth})[0]
    end

    def test_pause_resume_and_move_the_cursor_by_id_and_by_time
      handled = []
      define_subscriber("Counter", "/work", deferred: true, start: :oldest) { |_, m| handled << m.global_id }
      ids = 5.times.map { Herald.bus.store.append("/work", "1", codec: Codec::Json).global_id }
      store.save_cursor("Counter", ids[2])
      body = assert_page(get("/subscribers"), "Counter")
      assert_match %r{<td class="num lag">2</td>}, body
      assert_equal 409, post("/subscribers/reset", {"name" => "Counter", "id" => ids[0].to_s})[0], "not paused"
      assert_equal 303, post("/subscribers/pause", {"name" => "Counter"})[0]
      assert_includes get("/subscribers")[2], "paused"
      response = post("/subscribers/reset", {"name" => "Counter", "id" => ids[1].to_s})
      assert_equal 303, response[0]
      assert_equal ids[0], store.load_cursor("Counter")
      assert_match(/now #{ids[0]}/, notice(response))
      held = store.lease("Counter")
      assert_equal 409, post("/subscribers/reset", {"name" => "Counter", "id" => "1"})[0], "a worker holds the lease"
      held.release
      at = Time.at(store.global_backlog(ids[3] - 1, limit: 1).first.created_at).utc.iso8601(6)
      assert_equal 303, post("/subscribers/reset", {"name" => "Counter", "time" => at})[0]
      assert_equal ids[3] - 1, store.load_cursor("Counter")
      assert_equal 422, post("/subscribers/reset", {"name" => "Counter", "time" => "not a time"})[0]
      assert_equal 303, post("/subscribers/resume", {"name" => "Counter"})[0]
      refute store.paused?("Counter")
    end

    def test_a_moved_cursor_is_not_pushed_past_older_dead_letters
      define_subscriber("Mover", "/m", deferred: true) { |*| }
      first = bury("Mover", "/m", boom)
      bury("Mover", "/m", boom)
      dead = Events::DeadLetters.new(store)
      assert_operator dead.last_buried("Mover"), :>, first.global_id
      post("/subscribers/pause", {"name" => "Mover"})
      post("/subscribers/reset", {"name" => "Mover", "id" => first.global_id.to_s})
      assert_equal 0, dead.last_buried("Mover"), "the worker resumes at the moved cursor"
    end

    def test_dead_letters_filter_paginate_retry_and_delete
      handled = []
      sub = define_subscriber("Retried", "/r", deferred: true) { |event, _| handled << event["n"] }
      60.times { |n| bury("Retried", "/r", (n % 3 == 0) ? boom : RuntimeError.new("rt"), data: {"n" => n}) }
      bury("Other", "/o", boom)
      body = assert_page(get("/dead"), "61 dead letters", "page 1 of 2")
      assert_page(get("/dead?subscriber=Retried&error=ArgumentError"), "20 dead letters")
      assert_page(get("/dead?page=2"), "page 2 of 2")
      assert_includes body, "Retry all 61"
      # One: handled once, gone from the list; retried again, nothing runs.
      response = post("/dead/retry", {"ids" => "Retried:1"})
      assert_equal 303, response[0]
      assert_equal [0], handled
      assert_match(/1 handled, 0 failed/, notice(response))
      post("/dead/retry", {"ids" => "Retried:1"})
      assert_equal [0], handled
      assert_page(get("/dead"), "60 dead letters")
      assert_equal 303, post("/dead/delete", {"ids" => "Retried:2"})[0]
      assert_page(get("/dead?subscriber=Retried"), "58 dead letters")
      # All of one error class, then delete the rest.
      response = post("/dead/retry", {"scope" => "filtered", "subscriber" => "Retried", "error" => "RuntimeError"})
      assert_match(/Retried 39 dead letters: 39 handled/, notice(response))
      assert_equal 40, handled.size
      assert_equal handled.uniq, handled
      assert_page(get("/dead?subscriber=Retried"), "19 dead letters")
      post("/dead/delete", {"scope" => "filtered", "subscriber" => "Retried"})
      assert_page(get("/dead?subscriber=Retried"), "0 dead letters")
      assert_page(get("/dead"), "1 dead letters")
      assert_equal 40, handled.size
      assert sub
    end

    def test_a_retry_that_fails_again_is_buried_anew
      define_subscriber("Flaky", "/f", deferred: true) { |*| raise IOError, "still down" }
      bury("Flaky", "/f", boom, attempts: 2)
      response = post("/dead/retry", {"ids" => "Flaky:1"})
      assert_match(/0 handled, 1 failed again/, notice(response))
      letters = Events::DeadLetters.new(store).pending("Flaky")
      assert_equal [["IOError", 3]], letters.map { |l| [l.error, l.attempts] }
      assert_includes letters.first.backtrace.first, __FILE__
    end

    def test_retry_of_a_subscriber_not_loaded_here_asks_its_worker_through_the_store
      bury("Elsewhere", "/e", boom)
      response = post("/dead/retry", {"ids" => "Elsewhere:1"})
      assert_equal 303, response[0]
      assert_match(/Asked Elsewhere's worker to retry 1 dead letters/, notice(response))
      assert_equal 1, store.last_id(Events::DeadLetters.request_channel("Elsewhere"))
      assert_equal 1, Events::DeadLetters.new(store).pending("Elsewhere").size, "until its worker runs it"
    end

    def test_channels_browse_by_id_and_publish
      70.times { |i| Herald.publish(NASTY, {"i" => i}) }
      body = assert_page(get("/channel?name=#{URI.encode_www_form_component(NASTY)}&after=10"), "{&quot;i&quot;:10}", "{&quot;i&quot;:59}", "newer →")
      refute_includes body, "{&quot;i&quot;:9}"
      refute_includes body, "{&quot;i&quot;:60}"
      response = post("/channel/publish", {"name" => NASTY, "data" => "{\"text\":\"from the form ✓\"}"})
      assert_equal 303, response[0]
      assert_equal 71, Herald.last_id(NASTY)
      assert_equal({"text" => "from the form ✓"}, Herald.backlog(NASTY, 70).first.data)
      assert_equal 422, post("/channel/publish", {"name" => NASTY, "data" => "{nope"})[0]
      assert_match %r{<td class="num rate">71</td>}, get("/channel?name=#{URI.encode_www_form_component(NASTY)}")[2], "published in the last minute"
      assert_match %r{<td class="num">71</td><td class="num">[^<]+</td><td class="num">71</td>}, assert_page(get("/channels"), NASTY.sub("<", "&lt;").sub(">", "&gt;")[0, 12])
    end

    def test_metrics_and_health_beside_the_pages
      Herald.publish("/a", "x")
      status, headers, body = get("/metrics")
      assert_equal 200, status
      assert_equal Web::Metrics::CONTENT_TYPE, headers["content-type"]
      assert_match(/^herald_\w+/, body)
      status, _, body = get("/health")
      assert_equal 200, status
      assert_equal "ok", JSON.parse(body)["status"]
      Herald::Web.health_options = {lag_max: 0}
      define_subscriber("Behind", "/a", deferred: true) { |*| }
      store.save_cursor("Behind", 0)
      assert_equal 503, get("/health")[0]
    end

    def test_subscribers_named_in_the_settings_are_listed
      store.save_cursor("RunsElsewhere", 0)
      Herald.publish("/a", 1)
      refute_includes get("/subscribers")[2], "RunsElsewhere"
      refute_includes get("/metrics")[2], "RunsElsewhere"
      Herald::Web.subscribers = ["RunsElsewhere"]
      assert_match %r{data-subscriber="RunsElsewhere">.*?<td class="num lag">1</td>}m, get("/subscribers")[2]
      assert_includes get("/metrics")[2], %(herald_subscriber_lag_messages{subscriber="RunsElsewhere"} 1)
    end

    def test_a_retry_in_progress_is_shown_then_cleared
      log = capture_log do
        calls = Queue.new
        define_subscriber("Slow", "/slow", deferred: true, retry_on: {attempts: 3, wait: 0.4}) do |*|
          calls << true
          raise IOError, "down"
        end
        Herald.start_workers
        msg = store.append("/slow", "1", codec: Codec::Json)
        Timeout.timeout(10) { calls.pop }
        shown = %r{data-subscriber="Slow">.*global id #{msg.global_id}, attempt 2 of 3}m
        Timeout.timeout(10) { sleep 0.02 until get("/subscribers")[2].match?(shown) } # until the second call, 0.4 s on
        Timeout.timeout(10) { sleep 0.05 until Events::DeadLetters.new(store).pending("Slow").any? }
        Timeout.timeout(10) { sleep 0.05 while store.retrying("Slow") }
        refute_match(/attempt \d of 3/, get("/subscribers")[2])
      end
      assert_includes log, "gave up on /slow"
    end

    def test_a_retry_mark_left_by_a_dead_worker_is_not_shown
      Herald::Web.subscribers = ["Ghost"]
      store.mark_retrying("Ghost", 5, 2)
      refute_includes get("/subscribers")[2], "attempt 2"
      lease = store.lease("Ghost")
      assert_includes get("/subscribers")[2], "global id 5, attempt 2 of ?"
      lease.release
    end

    def test_events_per_second_from_the_cursor_between_page_loads_and_auto_refresh
      define_subscriber("Rated", "/rated", deferred: true) { |*| }
      store.save_cursor("Rated", store.last_global_id)
      rate = %r{data-subscriber="Rated">.*?<td class="num rate">([\d.]*)</td>}m
      assert_equal "", get("/subscribers")[2][rate, 1], "no rate on the first look"
      ids = 10.times.map { store.append("/rated", "1", codec: Codec::Json).global_id }
      5.times { store.append("/other", "1", codec: Codec::Json) } # not its events
      store.save_cursor("Rated", store.last_global_id)
      sleep Web::SubscriberStatus::RATE_AFTER + 0.05
      shown = Float(get("/subscribers")[2][rate, 1])
      assert_includes 4.0..10.0, shown, "10 of its events in about a second (#{ids.size} published)"
      body = get("/subscribers?refresh=on")[2]
      assert_includes body, "<meta http-equiv=\"refresh\" content=\"2\">"
      refute_includes get("/subscribers")[2], "http-equiv"
    end

    def test_a_channels_own_retention_is_shown
      Herald.publish("/kept", "x", max_backlog_size: 5, max_backlog_age: 3600)
      assert_page(get("/channel?name=%2Fkept"), "5 messages, 1 h")
      assert_page(get("/channel?name=%2Fdefault"), "1000 messages, 7 days")
    end

    def test_store_page_reports_the_store
      Herald.publish("/a", "x")
      body = assert_page(get("/store"), "kind", store.epoch, "last global id", "parked HTTP clients (this process")
      store_facts(body)
    end
  end
end
