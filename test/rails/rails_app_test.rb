# frozen_string_literal: true

require "test_helper"
require "open3"
require "socket"
require "net/http"
require "json"
require "herald/rails/versions"
require "yaml"
require "erb"
require_relative "turbo_streams_check"
require_relative "cable_variants_check"

# A real Rails app, as a user builds it: `rails new` (default options: importmap, Turbo, Stimulus, SQLite, and
# on Rails 8 Solid Cache/Queue/Cable), the gem built from this checkout and installed, the README's "Installing
# in Rails" steps, then Puma in cluster mode (2 workers, preload) in production, with two signed-in users in
# headless Chromium. Which Rails runs depends on the Ruby (Rails 8 needs Ruby >= 3.2): see RAILS.
#
# Part of bin/test (HERALD_RAILS_TEST=0 turns it off). Rails and the gems of its default Gemfile are installed
# once into vendor/rails-gems/ruby-<ABI>/<version> (HERALD_RAILS_GEMS for another base; one directory per Ruby
# and Rails: Rails 7.0's rack 2 and Rails 7.2's rackup both install a `rackup` executable); the first run takes
# 10-17 minutes, later runs install nothing (`bundle install --local`). Screenshots and the apps' logs are kept
# in tmp/rails-artifacts/<test>.
#
# Every check of a run is a method called from #production or #development: add yours there.
class RailsAppTest < Minitest::Test
  include TurboStreamsCheck # #check_turbo_streams: Turbo Streams on adapter: herald
  include CableVariantsCheck # Herald on Redis through a restart; Solid Cable kept (Rails 8)

  ROOT = File.expand_path("../..", __dir__)
  GEMS = File.join(ENV.fetch("HERALD_RAILS_GEMS", File.join(ROOT, "vendor", "rails-gems")), "ruby-#{RbConfig::CONFIG["ruby_version"]}")
  RUBY_3_2 = Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.2")
  # The current Rails for this Ruby, a default `rails new` app with the Puma it picks (`puma >= 5.0`: the
  # newest, 8.x today). Rails 7.2.4 is the newest that runs on Ruby 3.1.
  RAILS = RUBY_3_2 ? "8.1.4" : "7.2.4"
  # The oldest supported minor (Herald::Rails::MINIMUM_RAILS; Rack 2.2), production only, on Ruby 3.1: a
  # `--minimal` app with Puma 6 (its `rails new` asks for Puma 5, which Herald's plugin does not support).
  OLDEST_RAILS = "7.0.10"
  OLDEST_PUMA = "6.6.1"
  # Nokogiri's newer Linux gems (1.18+, platform x86_64-linux-gnu) need RubyGems >= 3.3.22; Debian's Ruby 3.1
  # has 3.3.15, which then builds the source gem (about 15 minutes here). 1.17.2 is the newest that ships a
  # plain x86_64-linux (precompiled) gem; other platforms and newer RubyGems get the newest nokogiri.
  NOKOGIRI = "1.17.2"
  ARTIFACTS = File.join(ROOT, "tmp", "rails-artifacts")
  FIXTURE = File.join(__dir__, "app")
  README = File.join(ROOT, "README.md")

  def setup
    skip "HERALD_RAILS_TEST=0: the Rails app test is off" if ENV["HERALD_RAILS_TEST"] == "0"
    @tmp = Dir.mktmpdir("herald-rails")
    @pids = []
  end

  def teardown
    @pids&.each { |pid| Process.kill(:TERM, pid) rescue nil } # standard:disable Style/RescueModifier
    @pids&.each { |pid| Process.wait(pid) rescue nil } # standard:disable Style/RescueModifier
    keep_logs
    FileUtils.rm_rf(@tmp) if @tmp
  end

  def test_production_on_the_current_rails = production(RAILS)

  def test_production_on_the_oldest_rails
    skip "Rails #{OLDEST_RAILS} runs on Ruby 3.1 here (this is #{RUBY_VERSION})" if RUBY_3_2
    production(OLDEST_RAILS)
  end

  # Development: the same app under a Puma cluster, code reloading on. Editing the deferred subscriber
  # changes the handler of the next event, with no duplicate.
  def test_development_reloads_the_subscriber
    started = monotonic
    @rails_env = "development"
    app = new_app(rails: RAILS)
    pin_herald(app)
    port, puma_log = start_puma(app)
    browser = start_browser("http://127.0.0.1:#{port}", "development")
    check_development_live_messages(app, browser)
    check_development_reloads_the_subscriber(app)
    check_development_new_subscriber_file(app)
    check_test_helper_in_the_app(app)
    check_turbo_drive_subscription(app, port)
    development_log = File.read(File.join(app, "log", "development.log"))
    refute_match(%r{message-bus/(?!herald\.js)}, development_log)
    check_logs(puma_log, File.join(app, "log", "development.log"))
    log "Rails #{RAILS} development test in #{(monotonic - started).round(1)} s"
  end

  private

  # Every check of the production run, in order: each takes what it needs from @run (app, url, puma log, pid).
  def production(rails)
    started = monotonic
    app = new_app(rails: rails)
    log "Rails #{rails}: app generated and gem installed in #{(monotonic - started).round(1)} s"
    check_nothing_opened_at_boot(app)
    port, puma_log, puma_pid = start_puma(app)
    @run = {app: app, url: "http://127.0.0.1:#{port}", puma_log: puma_log, puma_pid: puma_pid}
    log "Rails #{rails} with Puma #{puma_version(app)} (#{puma_log})"
    check_live_messages
    check_rails_json
    check_deferred_exactly_once
    check_dashboard
    check_notifications
    check_turbo_streams unless oldest? # the default app brings turbo-rails and ActionCable
    check_rails_log
    check_solid_queue if rails8?
    check_kill_9_of_a_worker
    check_logs(puma_log)
    @run[:puma_pid] = stop_in_flight_and_restart(app, puma_pid)
    check_logs(*Dir[File.join(@tmp, "puma-*.log")])
    check_cable_on_redis unless oldest?
    check_solid_cable_kept if rails8?
    log "Rails #{rails}: production test in #{(monotonic - started).round(1)} s"
  end

  # Nothing opens the store at boot: a runner works with an unwritable HERALD_DIR, and leaves no directory.
  def check_nothing_opened_at_boot(app)
    out = run!(app, "bin/rails", "runner", "p 1", env: {"HERALD_DIR" => "/proc/herald-unwritable"})
    assert_equal "1\n", out
    run!(app, "bin/rails", "runner", "p 1")
    refute File.exist?(File.join(app, "storage", "herald")), "rails runner opened the store"
  end

  CHAT = "héllo 日本語 🎉 — «runner»"

  def check_live_messages
    app = @run[:app]
    browser = start_browser(@run[:url], "production-#{@rails}")
    run!(app, "bin/rails", "runner", <<~RUBY)
      Herald.publish("/chat", {"text" => #{CHAT.inspect}})
      Herald.publish("/private", {"text" => "only for user 1"}, user_ids: [1])
      20.times { |n| Herald.publish_event({"n" => n, "text" => "é"}, channel: "/orders") }
    RUBY
    received = browser_results(browser, "1" => 2, "2" => 1)
    assert_equal [["/chat", {"text" => CHAT}], ["/private", {"text" => "only for user 1"}]], received["1"]
    assert_equal [["/chat", {"text" => CHAT}]], received["2"], "user 2 never sees user 1's message"
  end

  # What Rails apps publish (a render's SafeBuffer, a TimeWithZone, a BigDecimal, symbol keys): a client's poll
  # reads what ActiveSupport::JSON.encode of the same value reads, as ActionCable.server.broadcast would send.
  def check_rails_json
    out = run!(@run[:app], "bin/rails", "runner", <<~RUBY)
      value = {html: ApplicationController.render(inline: "<p><%= t %></p>", locals: {t: "é & 日本語 🎉"}),
               at: Time.zone.local(2024, 1, 2, 3, 4, 5.678r), price: BigDecimal("19.99"), list: [:a, 1.5, nil]}
      Herald.publish("/rails-json", value)
      print "\nHERALD_JSON:", ActiveSupport::JSON.encode(value)
    RUBY
    uri = URI("#{@run[:url]}/message-bus/rails-json-client/poll?dlp=t")
    response = Net::HTTP.post(uri, JSON.generate({"/rails-json" => 0}), "Content-Type" => "application/json")
    assert_equal "200", response.code
    received = JSON.parse(response.body.force_encoding(Encoding::UTF_8)).find { |m| m["channel"] == "/rails-json" }
    # (After a marker: Rails 7.0's production logger writes its render lines to the same stdout.)
    expected = JSON.parse(out[/HERALD_JSON:(.*)\z/m, 1] || flunk("no JSON from the runner: #{out}"))
    assert_equal expected, received&.fetch("data"), "what a client receives"
    assert_equal "<p>é &amp; 日本語 🎉</p>", expected["html"]
    assert_equal "19.99", expected["price"]
  end

  def check_deferred_exactly_once
    app = @run[:app]
    handled_file = File.join(app, "log", "handled.txt")
    eventually(timeout: 30, message: "the deferred subscriber did not handle 20 events") do
      lines = File.exist?(handled_file) ? File.readlines(handled_file) : []
      lines if lines.size >= 20
    end
    sleep 1 # a duplicate would come now
    handled = File.readlines(handled_file)
    assert_equal (0..19).to_a, handled.map { |l| Integer(l.split[2]) }.sort, "each event exactly once across the workers"
    assert handled.all? { |l| l.split[3] == "é" }
    workers = puma_workers(@run[:puma_log])
    assert_empty handled.map { |l| Integer(l.split[0]) }.uniq - workers, "handled in Puma's workers only (#{workers})"
  end

  # The dashboard mounted in the app's routes, served by Puma's workers: each page in Chromium with the app's
  # real data (screenshots in the artifacts), the metrics count the publishes, a POST without the CSRF token is
  # refused and changes nothing, the health check answers 200.
  def check_dashboard
    dir = File.join(ARTIFACTS, name)
    FileUtils.mkdir_p(dir)
    out, status = Open3.capture2({"NODE_PATH" => File.join(ROOT, "node_modules")}, "node",
      File.join(__dir__, "dashboard_check.mjs"), @run[:url], dir, chdir: ROOT)
    assert status.success?, out
    result = JSON.parse(out.lines.last)
    assert_equal({"subscribers" => 200, "dead" => 200, "channels" => 200, "store" => 200}, result["pages"].transform_values { |p| p["status"] })
    assert_empty result["errors"], "the browser's console"
    assert_match(/OrderLogger\s+\d+\s+0\b/, result["pages"]["subscribers"]["text"], "OrderLogger, its cursor, lag 0 after its 20 events")
    assert_includes result["pages"]["channels"]["text"], "/orders"
    assert_match(/log/, result["pages"]["store"]["text"])
    metrics = Net::HTTP.get_response(URI("#{@run[:url]}/herald/metrics"))
    assert_equal "200", metrics.code
    assert_match(/^herald_subscriber_lag_messages\{subscriber="OrderLogger"\} 0$/, metrics.body)
    refused = Net::HTTP.post_form(URI("#{@run[:url]}/herald/subscribers/pause"), "name" => "OrderLogger")
    assert_equal "403", refused.code, "a POST without the CSRF token"
    row = Net::HTTP.get(URI("#{@run[:url]}/herald/subscribers")).force_encoding(Encoding::UTF_8)[%r{<tr data-subscriber="OrderLogger">.*?</tr>}m]
    assert_match(/<td>running<\/td>/, row.to_s, "still running after the refused pause")
    assert_equal "200", Net::HTTP.get_response(URI("#{@run[:url]}/herald/health")).code
    log "dashboard: 4 pages in Chromium (screenshots in #{dir}), metrics, CSRF refusal, health"
  end

  # kill -9 of the worker whose thread handled the events: Puma boots a new one (with its INFO line), a worker
  # takes the subscriber over, and the next 10 events are each handled once, none by the dead process.
  def check_kill_9_of_a_worker
    app = @run[:app]
    handled_file = File.join(app, "log", "handled.txt")
    victim = Integer(File.readlines(handled_file).last.split[0])
    Process.kill(:KILL, victim)
    eventually(timeout: 60, message: "Puma did not replace worker #{victim}") do
      (puma_workers(@run[:puma_log]) - [victim]).size >= 2 && File.read(@run[:puma_log]).scan(/Puma worker \d+ \(pid \d+\)/).size >= 3
    end
    run!(app, "bin/rails", "runner", '(20...30).each { |n| Herald.publish_event({"n" => n, "text" => "after-kill"}, channel: "/orders") }')
    eventually(timeout: 60, message: "after kill -9 of #{victim}: not every event handled") { (numbers(handled_file) & (20...30).to_a).size == 10 }
    sleep 1 # a duplicate would come now
    after = File.readlines(handled_file).select { |l| l.split[3] == "after-kill" }
    assert_equal (20...30).to_a, after.map { |l| Integer(l.split[2]) }.sort, "each event once after the kill -9"
    refute_includes after.map { |l| Integer(l.split[0]) }, victim
    log "kill -9 of worker #{victim}: the next 10 events handled once, by #{after.map { |l| l.split[0] }.uniq.join(", ")}"
  end

  # ActiveSupport::Notifications (the fixture's initializer writes each *.herald event as a JSON line).
  def check_notifications
    workers = puma_workers(@run[:puma_log])
    notes = File.readlines(File.join(@run[:app], "log", "herald_notifications.txt")).map { |l| JSON.parse(l) }
    assert notes.any? { |n| n["name"] == "publish_message.herald" && n["channel"] == "/chat" && n["global_id"] }, "the runner's publish"
    assert notes.any? { |n| n["name"] == "poll.herald" && n["status"] == 200 && workers.include?(n["pid"]) }, "the workers' polls"
    assert notes.any? { |n| n["name"] == "deliver.herald" && n["messages"] >= 1 }, "a delivery to a parked client"
    assert notes.any? { |n| n["name"] == "process.herald" && n["subscriber"] == "OrderLogger" }, "the deferred handler calls"
  end

  # The Rails log goes to Puma's output in production (STDOUT).
  def check_rails_log
    text = File.read(@run[:puma_log])
    assert_match(/deferred subscriber OrderLogger failed on \/orders .*first attempt fails \(ü\)/, text, "Herald's warning in the Rails log")
    refute_match(%r{message-bus/(?!herald\.js)}, text, "a poll's path (with its client id) in the Rails log")
    refute_match(/Thread\(s\) started in app boot/, text)
    assert File.directory?(File.join(@run[:app], "storage", "herald", "production")), "the store of the environment"
    herald = text.lines.grep(/Puma worker \d+ \(pid \d+\): deferred subscribers running: OrderLogger/)
    assert_equal puma_workers(@run[:puma_log]).sort, herald.map { |l| Integer(l[/\(pid (\d+)\)/, 1]) }.sort,
      "one INFO line of Herald's Puma plugin per worker"
  end

  # Rails 8's default job backend beside Herald: Solid Queue's supervisor runs inside Puma (its plugin, with
  # SOLID_QUEUE_IN_PUMA, next to `plugin :herald`); a job enqueued by a runner is performed there, once.
  def check_solid_queue
    app = @run[:app]
    jobs = File.join(app, "log", "jobs.txt")
    run!(app, "bin/rails", "runner", 'NoteJob.perform_later("jöb ✓")')
    eventually(timeout: 60, message: "Solid Queue did not perform the job") { File.exist?(jobs) && File.read(jobs).include?("jöb ✓") }
    sleep 1 # a second run would come now
    assert_equal ["jöb ✓"], File.readlines(jobs).map { |l| l.split(" ", 2)[1].chomp }
    log "Solid Queue performed the job in pid #{File.read(jobs).split.first} (Puma workers: #{puma_workers(@run[:puma_log])})"
  end

  # What a log may say that is a warning, an error or a backtrace, and the lines the test itself causes.
  LOG_PROBLEM = /warn|error|fatal|exception|deprecat|backtrace|\.rb:\d+:in |^\s+from \S+:\d+/i
  EXPECTED_LOG_LINES = [
    # the fixture's OrderLogger fails once on purpose: Herald's retry line
    %r{deferred subscriber OrderLogger failed on /orders #\d+ \(attempt 1 of 3\), retrying in [\d.]+ s: .*first attempt fails \(ü\)},
    # Rails 8.1 in development names the line of each redirect (verbose_redirect_logs): not a backtrace
    /\A\s*↳ app\/\S+\.rb:\d+:in /
  ].freeze

  # Puma's and Rails' logs: no WARNING (Puma's failed hooks, deprecations, Ruby warnings), no error, no backtrace.
  def check_logs(*files, expected: [])
    files.each do |file|
      problems = File.readlines(file).grep(LOG_PROBLEM).reject { |l| (EXPECTED_LOG_LINES + expected).any? { l.match?(_1) } }
      assert_empty problems, "#{File.basename(file)} has warnings, errors or backtraces (#{file})"
    end
  end

  def check_development_live_messages(app, browser)
    run!(app, "bin/rails", "runner", <<~RUBY)
      Herald.publish("/chat", {"text" => "dév ✓"})
      Herald.publish("/private", {"text" => "for 1"}, user_ids: [1])
      Herald.publish_event({"n" => 100, "text" => "v1"}, channel: "/orders")
    RUBY
    received = browser_results(browser, "1" => 2, "2" => 1)
    assert_equal [["/chat", {"text" => "dév ✓"}], ["/private", {"text" => "for 1"}]], received["1"]
    assert_equal [["/chat", {"text" => "dév ✓"}]], received["2"]
  end

  def check_development_reloads_the_subscriber(app)
    handled = File.join(app, "log", "handled.txt")
    eventually(timeout: 30, message: "event 100 not handled") { File.exist?(handled) && File.read(handled).include?(" 100 ") }
    subscriber = File.join(app, "app", "subscribers", "order_logger.rb")
    sleep 1.1 # a new mtime second: the file watcher compares modification times
    File.write(subscriber, File.read(subscriber).sub("\#{event[\"text\"]}", "edited-\#{event[\"text\"]}"))
    run!(app, "bin/rails", "runner", 'Herald.publish_event({"n" => 101, "text" => "v2"}, channel: "/orders")')
    eventually(timeout: 30, message: "event 101 not handled: #{File.read(handled)}") { File.read(handled).include?(" 101 ") }
    sleep 1 # a duplicate (old and new class both registered) would come now
    lines = File.readlines(handled).map { |l| l.split[2..].join(" ") }
    assert_equal ["100 v1", "101 edited-v2"], lines, "the edited code handles the next event, once"
  end

  # A new file in app/subscribers, no restart: the workers' reload check (about every second) loads it and
  # its deferred subscriber handles what is published from then on, once across the two workers.
  def check_development_new_subscriber_file(app)
    out = File.join(app, "log", "new_file.txt")
    File.write(File.join(app, "app", "subscribers", "new_file_logger.rb"), <<~'RUBY')
      class NewFileLogger
        include Herald::Subscriber
        subscribe_to "/new-file"
        deferred
        def call(event, message) = Rails.root.join("log", "new_file.txt").open("a") { |f| f.puts "#{Process.pid} #{event["n"]}" }
      end
    RUBY
    run!(app, "bin/rails", "runner", '3.times { |n| Herald.publish_event({"n" => n}, channel: "/new-file") }')
    eventually(timeout: 30, message: "the new subscriber file was not picked up") { File.exist?(out) && File.readlines(out).size >= 3 }
    sleep 1.5 # a duplicate from the other worker would come now
    assert_equal %w[0 1 2], File.readlines(out).map { |l| l.split[1] }, "each event once, by the new file's subscriber"
    log "a new file in app/subscribers picked up without a restart (worker #{File.readlines(out).first.split[0]})"
  end

  # The app's own test suite: Herald::TestHelper in `bin/rails test`, deferred subscribers run inline.
  def check_test_helper_in_the_app(app)
    out = run!(app, "bin/rails", "test", "test/herald_inline_test.rb", env: {"RAILS_ENV" => "test"})
    assert_match(/2 runs, \d+ assertions, 0 failures, 0 errors/, out)
  end

  # The README's importmap line (config/importmap.rb), read from the README.
  def pin_herald(app)
    pin = File.read(README)[/^pin "herald", to: .*$/]
    assert pin, "the README's importmap pin"
    File.write(File.join(app, "config", "importmap.rb"), "#{File.read(File.join(app, "config", "importmap.rb"))}#{pin}\n")
  end

  # The README's page example (<%= herald_subscribe %>, fixture pages/feed with the importmap variant) under
  # Turbo Drive: 10 visits, then one publish is shown once.
  def check_turbo_drive_subscription(app, port)
    dir = File.join(ARTIFACTS, name)
    stdin, stdout, wait = Open3.popen2({"NODE_PATH" => File.join(ROOT, "node_modules")}, "node",
      File.join(__dir__, "feed_check.mjs"), "http://127.0.0.1:#{port}", dir, chdir: ROOT)
    @pids << wait.pid
    assert_equal "ready\n", Timeout.timeout(120) { stdout.gets }
    run!(app, "bin/rails", "runner", 'Herald.publish("/feed", {"text" => "once ✓ 日本語 🎉"})')
    stdin.puts "go"
    stdin.close
    result = JSON.parse(Timeout.timeout(60) { stdout.gets }.to_s)
    wait.value
    assert_equal({"items" => ["once ✓ 日本語 🎉"], "marker" => "no full load", "subscriptions" => 1, "channels" => ["/feed"], "errors" => []}, result)
    log "10 Turbo Drive visits, one publish shown once (importmap-rails pin, herald_subscribe)"
  end

  SLOW = (1000...1012).to_a

  # Graceful stop with Puma's own SIGTERM handler: SIGTERM to the Puma master while a slow deferred handler
  # runs (Puma stops each worker; its before_worker_shutdown hook, from `plugin :herald`, runs
  # Herald.shutdown), then a new cluster on the same store. Asserted: the handler in flight when the signal
  # came finished before its worker exited (not abandoned); some events were left for the restart; after it,
  # each of the 12 events was handled, none twice. Herald promises at-least-once (an abandoned handler's
  # event runs again); a graceful stop saves the exact cursor, so here it must be exactly once.
  def stop_in_flight_and_restart(app, puma_pid)
    started = File.join(app, "log", "started.txt")
    handled = File.join(app, "log", "handled.txt")
    run!(app, "bin/rails", "runner", <<~RUBY)
      #{SLOW}.each { |n| Herald.publish_event({"n" => n, "text" => "slow", "sleep" => 1.0}, channel: "/orders") }
    RUBY
    in_flight = eventually(timeout: 30, message: "no slow event started") do
      begun = numbers(started)
      (begun - numbers(handled)).first if begun.size >= 3
    end
    Process.kill(:TERM, puma_pid)
    status = Timeout.timeout(60) { Process.wait2(puma_pid)[1] }
    @pids.delete(puma_pid)
    # Puma re-raises SIGTERM once stopped (raise_exception_on_sigterm): killed by TERM is its clean exit.
    assert status.success? || status.termsig == Signal.list["TERM"], "Puma's exit after SIGTERM: #{status}"
    before = numbers(handled) & SLOW
    assert_includes before, in_flight, "event #{in_flight} was in flight at SIGTERM and must finish before its worker exits"
    assert_operator before.size, :<, SLOW.size, "Puma stopped after every slow event: nothing tested the restart"

    restarted = start_puma(app, label: "production-restarted").last
    eventually(timeout: 60, message: "after the restart, not every event was handled: #{numbers(handled)}") do
      (SLOW - numbers(handled)).empty?
    end
    sleep 1 # a duplicate would come now
    assert_equal SLOW, numbers(handled).select { SLOW.include?(_1) }.sort, "each event once across the stop and restart"
    log "SIGTERM with event #{in_flight} in flight: #{before.size} of #{SLOW.size} handled before, the rest after the restart"
    restarted
  end

  def numbers(file) = File.exist?(file) ? File.readlines(file).map { |l| Integer(l.split[2]) } : []

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def log(line) = warn("[rails app] #{line}")

  # Only the Rails gems directory and what the app's bundle holds: nothing from this checkout's bundle.
  def env
    clean = ENV.to_h.select { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB].include?(k) }.transform_values { nil }
    clean.merge("GEM_HOME" => gems, "GEM_PATH" => gems, "PATH" => "#{gems}/bin:#{ENV["PATH"]}",
      "SECRET_KEY_BASE" => "x" * 64, "RAILS_LOG_TO_STDOUT" => "1", "RAILS_ENV" => @rails_env || "production",
      "NOKOGIRI_USE_SYSTEM_LIBRARIES" => "1", "SOLID_QUEUE_IN_PUMA" => ("1" if @rails && rails8? && @rails_env != "development"), # its tables: production's queue database
      "RAILS_SERVE_STATIC_FILES" => "1") # Rails 7.0 serves public/ only with it (7.1+ always)
  end

  def run!(dir, *cmd, env: {})
    out, err, st = Open3.capture3(self.env.merge(env), *cmd, chdir: dir)
    assert st.success?, "#{cmd.join(" ")} failed (#{st}):\n#{out}\n#{err}"
    out
  end

  def gems = File.join(GEMS, @rails || RAILS)

  def oldest? = @rails == OLDEST_RAILS

  def rails8? = Gem::Version.new(@rails) >= Gem::Version.new("8")

  # Rails itself, once; the rest of a default app's Gemfile is installed by #bundle on its first run.
  def install_rails(rails)
    return if File.exist?(File.join(gems, "specifications", "railties-#{rails}.gemspec")) &&
      (!oldest? || File.exist?(File.join(gems, "specifications", "puma-#{OLDEST_PUMA}.gemspec")))
    log "installing Rails #{rails} into #{gems} (once)"
    started = monotonic
    run!(ROOT, "gem", "install", "--no-document", "nokogiri:#{NOKOGIRI}") if old_rubygems_on_linux?
    # --conservative: keeps that nokogiri (NOKOGIRI_USE_SYSTEM_LIBRARIES, see #env, if one is built)
    run!(ROOT, "gem", "install", "--conservative", "--no-document", "rails:#{rails}", *("puma:#{OLDEST_PUMA}" if oldest?))
    log "installed in #{(monotonic - started).round(1)} s"
  end

  def old_rubygems_on_linux? = Gem::Platform.local.to_s == "x86_64-linux" && Gem.rubygems_version < Gem::Version.new("3.3.22")

  # `bundle install` from the gems already in #gems (no network); on the first run, the Gemfile's gems are
  # installed there first, by name (--conservative: the installed nokogiri stays).
  def bundle(app)
    _, _, st = Open3.capture3(env, "bundle", "install", "--local", chdir: app)
    return if st.success?
    started = monotonic
    # Read by the Bundler the app uses (this process's may be older than the Gemfile's platform names).
    wanted = run!(app, "ruby", "-rbundler", "-e", <<~RUBY).lines.map(&:chomp)
      Bundler::Dsl.evaluate("Gemfile", nil, {}).dependencies.select(&:current_platform?).each { |d| puts "\#{d.name}:\#{d.requirement}" }
    RUBY
    log "installing the app's gems into #{gems} (once): #{wanted.join(", ")}"
    run!(app, "gem", "install", "--conservative", "--no-document", *wanted)
    run!(app, "bundle", "install", "--local")
    log "installed in #{(monotonic - started).round(1)} s"
  end

  # Screenshots are written there by browser_check.mjs; the Puma and Rails logs are copied next to them.
  def keep_logs
    return unless @tmp && File.directory?(@tmp)
    dir = File.join(ARTIFACTS, name)
    FileUtils.mkdir_p(dir)
    Dir[File.join(@tmp, "*.log"), File.join(@tmp, "app", "log", "*.{log,txt}")].each { |f| FileUtils.cp(f, dir) }
    log "#{name}: screenshots and logs in #{ARTIFACTS}"
  end

  def new_app(rails:)
    @rails = rails
    install_rails(rails)
    install_herald
    app = oldest? ? minimal_app : default_app
    cable = File.join(app, "config", "cable.yml")
    @rails_new_cable = File.read(cable) if File.exist?(cable)
    readme_install(app)
    FileUtils.cp_r("#{FIXTURE}/.", app)
    configure_production(app)
    run!(app, "bin/rails", "db:prepare") unless oldest?
    run!(app, "bin/rails", "assets:precompile") if !oldest? && @rails_env != "development"
    app
  end

  # The gem built from this checkout, installed into #gems: what `gem "herald-bus"` then finds.
  def install_herald
    gem = File.join(@tmp, "herald-bus-#{Herald::VERSION}.gem")
    run!(ROOT, "gem", "build", "herald-bus.gemspec", "--output", gem)
    # Its dependencies by name first: `gem install` of a .gem file with dependencies to fetch resolves them from
    # the whole remote index (RubyGems 3.3: 1.4 GB and over 7 minutes here); by name, seconds.
    deps = Gem::Specification.load(File.join(ROOT, "herald-bus.gemspec")).runtime_dependencies
    missing = deps.reject { |d| Dir[File.join(gems, "specifications", "#{d.name}-*.gemspec")].any? { |f| d.match?(Gem::Specification.load(f)) } }
    run!(@tmp, "gem", "install", "--conservative", "--no-document", *missing.map { |d| "#{d.name}:#{d.requirement}" }) if missing.any?
    run!(@tmp, "gem", "install", "--local", "--no-document", gem)
  end

  # `rails new` with its defaults, then what it runs after `bundle install` (railties' app generator:
  # run_javascript, run_hotwire, run_solid; --skip-bundle only so that #bundle installs without network).
  # Kamal (deployment) is left out: its `kamal init` writes deploy files this test has no use for.
  def default_app
    run!(@tmp, "rails", "_#{@rails}_", "new", "app", "--skip-bundle", "--skip-git", *("--skip-kamal" if rails8?))
    app = File.join(@tmp, "app")
    bundle(app)
    run!(app, "bin/rails", "importmap:install")
    run!(app, "bin/rails", "turbo:install", "stimulus:install")
    return app unless rails8?
    run!(app, "bin/rails", "solid_cache:install", "solid_queue:install", "solid_cable:install")
    File.write(File.join(app, "app", "jobs", "note_job.rb"), <<~RUBY)
      class NoteJob < ApplicationJob
        def perform(text) = Rails.root.join("log", "jobs.txt").open("a") { |f| f.puts "\#{Process.pid} \#{text}" }
      end
    RUBY
    app
  end

  # What is not needed: everything `--minimal` leaves, plus what later Rails adds (Rails 7.0 ignores those).
  RAILS_NEW_MINIMAL = %w[--minimal --skip-active-record --skip-bundle --skip-git --skip-test --skip-system-test
    --skip-asset-pipeline --skip-javascript --skip-bootsnap --skip-docker --skip-rubocop --skip-brakeman --skip-ci].freeze

  def minimal_app
    run!(@tmp, "rails", "_#{@rails}_", "new", "app", *RAILS_NEW_MINIMAL)
    app = File.join(@tmp, "app")
    File.write(File.join(app, "Gemfile"), <<~GEMFILE)
      source "https://rubygems.org"
      gem "rails", "#{@rails}"
      gem "puma", "#{OLDEST_PUMA}"
    GEMFILE
    # What its layout and the browser ask for, without an asset pipeline (a 404 is a FATAL line in Rails' log).
    FileUtils.mkdir_p(File.join(app, "public", "stylesheets"))
    File.write(File.join(app, "public", "stylesheets", "application.css"), "")
    File.write(File.join(app, "public", "favicon.ico"), "")
    app
  end

  # The README's "Installing in Rails", step 1: its Gemfile lines added, `bundle install`, the generator.
  def readme_install(app)
    section = File.read(README)[/^## Installing in Rails\n.*?(?=^## )/m]
    gemfile_lines = section[/```ruby\n# Gemfile\n(.*?)```/m, 1]
    assert gemfile_lines, "the README's Rails section has no Gemfile block"
    # The README's `path:`, a checkout of this repository beside the app: this one (test/gem_package_test.rb
    # runs the same lines from a fresh clone).
    path = gemfile_lines[/^gem "herald-bus", path: "([^"]+)"/, 1]
    File.symlink(ROOT, File.expand_path(path, app)) if path
    gemfile = File.join(app, "Gemfile")
    File.write(gemfile, File.read(gemfile) + gemfile_lines)
    run!(app, "bundle", "install", "--local") # the README's `bundle install`, from the gems installed here
    pin_json(app, gemfile) if Gem::Version.new(@rails) < Gem::Version.new(Herald::Rails::JSON_3_RAILS)
    commands = section[/```sh\nbundle install\n(.*?)```/m, 1].to_s.lines.map(&:strip)
    assert_equal ["bin/rails generate herald:install"], commands, "the README's commands after bundle install"
    commands.each { |c| run!(app, *c.split) }
  end

  # What a deployment on this machine sets: plain HTTP on 127.0.0.1 (no forced SSL; with assume_ssl the
  # session cookie would be Secure-only), and the production databases' paths (commented out in new apps
  # without Kamal: Rails 7.2's one, Rails 8's primary, cache, queue and cable).
  def configure_production(app)
    production = File.join(app, "config", "environments", "production.rb")
    text = File.read(production).sub(/^(\s*)config.force_ssl = true/, '\1config.force_ssl = false')
      .sub(/^(\s*)config.assume_ssl = true/, '\1config.assume_ssl = false')
    # Rails 8's logger prints the bare message; #check_logs needs each line's severity (Rails 7's format).
    File.write(production, text.sub("ActiveSupport::TaggedLogging.logger(STDOUT)", "ActiveSupport::TaggedLogging.logger(STDOUT, formatter: ::Logger::Formatter.new)"))
    database = File.join(app, "config", "database.yml")
    return unless File.exist?(database)
    File.write(database, File.read(database).gsub(%r{^(\s*)# database: path/to/persistent/storage/}, '\1database: storage/'))
  end

  # Rails 7.0 and 7.1 with json 3 (what herald-bus's json >= 2.10 lets Bundler pick): the app stops at boot
  # with the line to add, the user adds it.
  def pin_json(app, gemfile)
    _, err, st = Open3.capture3(env, "bin/rails", "runner", "p 1", chdir: app)
    refute st.success?, "Rails #{@rails} booted with json 3"
    assert_includes err, %(cannot run with json 3.), err
    assert_includes err, %(add gem "json", "~> 2.10" to your Gemfile)
    run!(app, "gem", "install", "--no-document", "json:~> 2.10") if Dir[File.join(gems, "specifications", "json-2.*.gemspec")].empty?
    File.write(gemfile, File.read(gemfile) + %(gem "json", "~> 2.10"\n))
    run!(app, "bundle", "install", "--local")
  end

  def puma_version(app) = File.read(File.join(app, "Gemfile.lock"))[/^    puma \(([^)]+)\)/, 1]

  def free_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }

  def start_puma(app, label: @rails_env || "production")
    port = free_port
    log_file = File.join(@tmp, "puma-#{label}.log")
    pid = Process.spawn(env, "bundle", "exec", "puma", "-C", "config/puma.rb", "-w", "2", "--preload",
      "-b", "tcp://127.0.0.1:#{port}", chdir: app, out: log_file, err: [:child, :out])
    @pids << pid
    eventually(timeout: 60, message: "Puma did not boot 2 workers: #{File.read(log_file) if File.exist?(log_file)}") do
      puma_workers(log_file).size == 2 && Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/")).code == "200"
    rescue SystemCallError
      false
    end
    [port, log_file, pid]
  end

  def puma_workers(log_file) = File.read(log_file).scan(/Worker \d+ \(PID: (\d+)\) booted/).flatten.map { Integer(_1) }.uniq

  def start_browser(url, label)
    dir = File.join(ARTIFACTS, name)
    FileUtils.mkdir_p(dir)
    stdin, stdout, wait = Open3.popen2({"NODE_PATH" => File.join(ROOT, "node_modules")}, "node",
      File.join(__dir__, "browser_check.mjs"), url, dir, label, chdir: ROOT)
    @pids << wait.pid
    line = Timeout.timeout(60) { stdout.gets }
    assert_equal "ready\n", line
    [stdin, stdout, wait]
  end

  def browser_results(browser, expected)
    stdin, stdout, wait = browser
    stdin.puts JSON.generate(expected)
    stdin.close
    result = Timeout.timeout(60) { stdout.gets }
    wait.value
    JSON.parse(result.to_s)
  end
end
