# frozen_string_literal: true

require "test_helper"
require "open3"
require "socket"
require "net/http"
require "json"

# A real Rails app, as a user builds it: `rails new`, the gem built from this checkout and installed,
# `rails g herald:install`, then Puma in cluster mode (2 workers, preload) in production, with two
# signed-in users in headless Chromium.
#
# Slow the first time (Rails and its native gems are installed into vendor/rails-gems, about 10 minutes
# on 2 cores; later runs reuse them): it runs when HERALD_RAILS_TEST=1 (.ci/run sets it).
class RailsAppTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)
  GEMS = ENV.fetch("HERALD_RAILS_GEMS", File.join(ROOT, "vendor", "rails-gems"))
  RAILS = "7.2.4" # the newest Rails that runs on Ruby 3.1 (Rails 8 needs 3.2)
  PUMA = "6.6.1"
  ARTIFACTS = File.join(ROOT, "test", "artifacts")
  FIXTURE = File.join(__dir__, "app")

  def setup
    skip "the Rails app test runs with HERALD_RAILS_TEST=1 (installs Rails #{RAILS} into #{GEMS} once)" unless ENV["HERALD_RAILS_TEST"] == "1"
    @tmp = Dir.mktmpdir("herald-rails")
    @pids = []
  end

  def teardown
    @pids&.each { |pid| Process.kill(:TERM, pid) rescue nil } # standard:disable Style/RescueModifier
    @pids&.each { |pid| Process.wait(pid) rescue nil } # standard:disable Style/RescueModifier
    FileUtils.rm_rf(@tmp) if @tmp
  end

  def test_production_under_puma_cluster
    started = monotonic
    app = new_app
    log "app generated and gem installed in #{(monotonic - started).round(1)} s"

    # Nothing opens the store at boot: a runner works with an unwritable HERALD_DIR, and leaves no directory.
    out = run!(app, "bin/rails", "runner", "p 1", env: {"HERALD_DIR" => "/proc/herald-unwritable"})
    assert_equal "1\n", out
    run!(app, "bin/rails", "runner", "p 1")
    refute File.exist?(File.join(app, "storage", "herald")), "rails runner opened the store"

    port, puma_log = start_puma(app)
    url = "http://127.0.0.1:#{port}"
    browser = start_browser(url, "production")

    chat = "héllo 日本語 🎉 — «runner»"
    run!(app, "bin/rails", "runner", <<~RUBY)
      Herald.publish("/chat", {"text" => #{chat.inspect}})
      Herald.publish("/private", {"text" => "only for user 1"}, user_ids: [1])
      20.times { |n| Herald.publish_event({"n" => n, "text" => "é"}, channel: "/orders") }
    RUBY
    received = browser_results(browser, "1" => 2, "2" => 1)
    assert_equal [["/chat", {"text" => chat}], ["/private", {"text" => "only for user 1"}]], received["1"]
    assert_equal [["/chat", {"text" => chat}]], received["2"], "user 2 never sees user 1's message"

    eventually(timeout: 30, message: "the deferred subscriber did not handle 20 events") do
      lines = File.exist?(File.join(app, "log", "handled.txt")) ? File.readlines(File.join(app, "log", "handled.txt")) : []
      lines if lines.size >= 20
    end
    sleep 1 # a duplicate would come now
    handled = File.readlines(File.join(app, "log", "handled.txt"))
    assert_equal (0..19).to_a, handled.map { |l| Integer(l.split[2]) }.sort, "each event exactly once across the workers"
    assert handled.all? { |l| l.split[3] == "é" }
    workers = puma_workers(puma_log)
    assert_empty handled.map { |l| Integer(l.split[0]) }.uniq - workers, "handled in Puma's workers only (#{workers})"
    # ActiveSupport::Notifications (the fixture's initializer writes each *.herald event as a JSON line).
    notes = File.readlines(File.join(app, "log", "herald_notifications.txt")).map { |l| JSON.parse(l) }
    assert notes.any? { |n| n["name"] == "publish_message.herald" && n["channel"] == "/chat" && n["global_id"] }, "the runner's publish"
    assert notes.any? { |n| n["name"] == "poll.herald" && n["status"] == 200 && workers.include?(n["pid"]) }, "the workers' polls"
    assert notes.any? { |n| n["name"] == "deliver.herald" && n["messages"] >= 1 }, "a delivery to a parked client"
    assert notes.any? { |n| n["name"] == "process.herald" && n["subscriber"] == "OrderLogger" }, "the deferred handler calls"

    text = File.read(puma_log)
    assert_match(/deferred subscriber OrderLogger failed on \/orders .*first attempt fails \(ü\)/, text, "Herald's warning in the Rails log")
    refute_match(%r{message-bus/(?!herald\.js)}, text, "a poll's path (with its client id) in the Rails log")
    refute_match(/Thread\(s\) started in app boot/, text)
    assert File.directory?(File.join(app, "storage", "herald", "production")), "the store of the environment"
    log "production test in #{(monotonic - started).round(1)} s"
  end

  # Development: the same app under a Puma cluster, code reloading on. Editing the deferred subscriber
  # changes the handler of the next event, with no duplicate.
  def test_development_reloads_the_subscriber
    started = monotonic
    app = new_app
    @rails_env = "development"
    port, puma_log = start_puma(app)
    browser = start_browser("http://127.0.0.1:#{port}", "development")
    run!(app, "bin/rails", "runner", <<~RUBY)
      Herald.publish("/chat", {"text" => "dév ✓"})
      Herald.publish("/private", {"text" => "for 1"}, user_ids: [1])
      Herald.publish_event({"n" => 100, "text" => "v1"}, channel: "/orders")
    RUBY
    received = browser_results(browser, "1" => 2, "2" => 1)
    assert_equal [["/chat", {"text" => "dév ✓"}], ["/private", {"text" => "for 1"}]], received["1"]
    assert_equal [["/chat", {"text" => "dév ✓"}]], received["2"]
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
    refute_match(%r{message-bus/(?!herald\.js)}, File.read(File.join(app, "log", "development.log")))
    refute_match(/Thread\(s\) started in app boot/, File.read(puma_log))
    log "development test in #{(monotonic - started).round(1)} s"
  end

  private

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def log(line) = warn("[rails app] #{line}")

  # Only the Rails gems directory and what the app's bundle holds: nothing from this checkout's bundle.
  def env
    clean = ENV.to_h.select { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || %w[RUBYOPT RUBYLIB].include?(k) }.transform_values { nil }
    clean.merge("GEM_HOME" => GEMS, "GEM_PATH" => GEMS, "PATH" => "#{GEMS}/bin:#{ENV["PATH"]}",
      "SECRET_KEY_BASE" => "x" * 64, "RAILS_ENV" => @rails_env || "production", "NOKOGIRI_USE_SYSTEM_LIBRARIES" => "1")
  end

  def run!(dir, *cmd, env: {})
    out, err, st = Open3.capture3(self.env.merge(env), *cmd, chdir: dir)
    assert st.success?, "#{cmd.join(" ")} failed (#{st}):\n#{out}\n#{err}"
    out
  end

  def install_rails
    return if File.exist?(File.join(GEMS, "specifications", "railties-#{RAILS}.gemspec")) &&
      File.exist?(File.join(GEMS, "specifications", "puma-#{PUMA}.gemspec"))
    log "installing Rails #{RAILS} and Puma #{PUMA} into #{GEMS} (once)"
    run!(ROOT, "gem", "install", "--no-document", "rails:#{RAILS}", "puma:#{PUMA}") # NOKOGIRI_USE_SYSTEM_LIBRARIES: see #env
  end

  def new_app
    install_rails
    gem = File.join(@tmp, "herald-bus-#{Herald::VERSION}.gem")
    run!(ROOT, "gem", "build", "herald-bus.gemspec", "--output", gem)
    # --local: the runtime dependencies are there after the first run (native ones take minutes to build).
    _, _, st = Open3.capture3(env, "gem", "install", "--local", "--no-document", gem, chdir: @tmp)
    run!(@tmp, "gem", "install", "--no-document", gem) unless st.success?
    run!(@tmp, "rails", "_#{RAILS}_", "new", "app", "--minimal", "--skip-active-record", "--skip-bundle", "--skip-git",
      "--skip-test", "--skip-system-test", "--skip-asset-pipeline", "--skip-javascript", "--skip-docker",
      "--skip-rubocop", "--skip-brakeman", "--skip-ci", "--skip-bootsnap")
    app = File.join(@tmp, "app")
    File.write(File.join(app, "Gemfile"), <<~GEMFILE)
      source "https://rubygems.org"
      gem "rails", "#{RAILS}"
      gem "puma", "#{PUMA}"
      gem "herald-bus", "#{Herald::VERSION}"
    GEMFILE
    run!(app, "bundle", "install", "--local")
    run!(app, "bin/rails", "generate", "herald:install")
    FileUtils.cp_r("#{FIXTURE}/.", app)
    production = File.join(app, "config", "environments", "production.rb")
    File.write(production, File.read(production).sub(/^(\s*)config.force_ssl = true/, '\1config.force_ssl = false'))
    app
  end

  def free_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }

  def start_puma(app)
    port = free_port
    log_file = File.join(@tmp, "puma-#{@rails_env || "production"}.log")
    pid = Process.spawn(env, "bundle", "exec", "puma", "-C", "config/puma.rb", "-w", "2", "--preload",
      "-b", "tcp://127.0.0.1:#{port}", chdir: app, out: log_file, err: [:child, :out])
    @pids << pid
    eventually(timeout: 60, message: "Puma did not boot 2 workers: #{File.read(log_file) if File.exist?(log_file)}") do
      puma_workers(log_file).size == 2 && Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/")).code == "200"
    rescue SystemCallError
      false
    end
    [port, log_file]
  end

  def puma_workers(log_file) = File.read(log_file).scan(/Worker \d+ \(PID: (\d+)\) booted/).flatten.map { Integer(_1) }.uniq

  def start_browser(url, label)
    FileUtils.mkdir_p(ARTIFACTS)
    stdin, stdout, wait = Open3.popen2({"NODE_PATH" => File.join(ROOT, "node_modules")}, "node",
      File.join(__dir__, "browser_check.mjs"), url, ARTIFACTS, label, chdir: ROOT)
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
