# frozen_string_literal: true

require "test_helper"
require "open3"
require "socket"
require "net/http"

# `plugin :herald` under real Puma 6, 7 and 8 (their hook APIs differ: Puma 7 keeps hooks as Hashes, renamed
# them and warns on the old names and on worker hooks in single mode). Each version runs a small Rack app in
# cluster mode (2 workers, preload) and in single mode, with a deferred subscriber; events are published
# over HTTP, then SIGTERM goes to Puma while a slow handler runs. Asserted: each event handled once, the
# in-flight handler finished before its process exited, one Herald INFO line per Puma process that
# serves, and nothing else from Herald or Puma that is a warning, an error or a backtrace.
#
# Each Puma is installed once (with its nio4r) into vendor/puma-gems/ruby-<ABI>/<version> (HERALD_PUMA_GEMS),
# apart from this checkout's bundle; HERALD_PUMA_VERSIONS="8.0.2 7.2.1" picks versions.
class PumaPluginTest < Minitest::Test
  ROOT = File.expand_path("../../..", __dir__)
  GEMS = ENV.fetch("HERALD_PUMA_GEMS", File.join(ROOT, "vendor", "puma-gems", "ruby-#{RbConfig::CONFIG["ruby_version"]}"))
  VERSIONS = ENV.fetch("HERALD_PUMA_VERSIONS", "6.6.1 7.2.1 8.0.2").split
  EVENTS = 10

  # The app: each handled event is a line "<pid> <n>" in handled.txt; a slow one first writes started.txt.
  CONFIG_RU = <<~RUBY
    require "herald"

    class Recorder
      include Herald::Subscriber
      subscribe_to "/jobs"
      deferred

      def call(event, _message)
        record("started.txt", event["n"]) if event["sleep"]
        sleep event["sleep"] if event["sleep"]
        record("handled.txt", event["n"])
      end

      def record(file, n) = File.open(File.join(ENV.fetch("OUT"), file), "a") { |f| f.puts "\#{Process.pid} \#{n}" }
    end

    run lambda { |env|
      n, sleep = env["QUERY_STRING"].split("-")
      event = {"n" => Integer(n)}
      event["sleep"] = Float(sleep) if sleep
      Herald.publish_event(event, channel: "/jobs")
      [200, {"content-type" => "text/plain"}, ["ok"]]
    }
  RUBY

  VERSIONS.each do |version|
    define_method(:"test_puma_#{version.tr(".", "_")}_cluster_2_workers_preload") { run_puma(version, cluster: true) }
    define_method(:"test_puma_#{version.tr(".", "_")}_single_mode") { run_puma(version, cluster: false) }
  end

  def setup
    @dir = Dir.mktmpdir("herald-puma")
    @pid = nil
  end

  def teardown
    if @pid
      Process.kill(:KILL, @pid) rescue nil # standard:disable Style/RescueModifier
      Process.wait(@pid) rescue nil # standard:disable Style/RescueModifier
    end
    FileUtils.rm_rf(@dir)
  end

  private

  def run_puma(version, cluster:)
    started = monotonic
    install(version)
    File.write(File.join(@dir, "config.ru"), CONFIG_RU)
    File.write(File.join(@dir, "puma.rb"), "plugin :herald\n") # the line `rails g herald:install` appends
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    log = File.join(@dir, "puma.log")
    args = ["-C", "puma.rb", "-b", "tcp://127.0.0.1:#{port}", *(cluster ? ["-w", "2", "--preload"] : []), "config.ru"]
    @pid = Process.spawn(env(version), "ruby", "-I", File.join(ROOT, "lib"), File.join(gems(version), "bin", "puma"),
      "_#{version}_", *args, chdir: @dir, out: log, err: [:child, :out])
    processes = cluster ? 2 : 1
    booted = cluster ? /Worker \d+ \(PID: \d+\) booted/ : /Use Ctrl-C to stop/
    eventually(timeout: 60, message: "Puma #{version} did not boot") do
      read(log).scan(booted).size == processes && get(port, "/?0").code == "200"
    rescue SystemCallError
      false
    end

    (1...EVENTS).each { |n| get(port, "/?#{n}") }
    eventually(timeout: 30, message: "not every event handled: #{handled}") { handled.size >= EVENTS }
    get(port, "/?#{EVENTS}-1.5")
    eventually(timeout: 30, message: "the slow event did not start") { lines("started.txt").any? }
    Process.kill(:TERM, @pid)
    status = Timeout.timeout(60) { Process.wait2(@pid)[1] }
    master, @pid = @pid, nil
    output = read(log)
    # Puma re-raises SIGTERM once stopped (raise_exception_on_sigterm): killed by TERM is its clean exit.
    assert status.success? || status.termsig == Signal.list["TERM"], "Puma's exit after SIGTERM: #{status}\n#{output}"
    assert_equal (0..EVENTS).to_a, handled.sort, "each event once, the one in flight at SIGTERM finished:\n#{output}"

    pids = cluster ? output.scan(/Worker \d+ \(PID: (\d+)\) booted/).flatten.map(&:to_i) : [master]
    herald = output.lines.grep(/herald/i)
    assert_equal processes, herald.size, "one Herald line per Puma process:\n#{output}"
    herald.each { |l| assert_match(/\A\[herald\] INFO: Puma (worker \d|single mode) \(pid \d+\): deferred subscribers running: Recorder\n\z/, l) }
    assert_equal pids.sort, herald.map { |l| Integer(l[/pid (\d+)/, 1]) }.sort, "in each worker, none in the master"
    refute_match(/warn|error|exception|deprecat|backtrace|\.rb:\d+:in |^\s+from /i, output, "Puma #{version}'s output")
    warn "[puma #{version}] #{cluster ? "cluster" : "single"}: #{(monotonic - started).round(1)} s, output:\n#{output.gsub(/^/, "  ")}" if ENV["VERBOSE"]
  end

  def handled = lines("handled.txt").map { |l| Integer(l.split[1]) }

  def lines(file) = File.exist?(path = File.join(@dir, file)) ? File.readlines(path) : []

  def read(file) = File.exist?(file) ? File.read(file) : ""

  def get(port, path) = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}#{path}"))

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def gems(version) = File.join(GEMS, version)

  # This Puma and its nio4r from their own directory, Herald's other gems from this checkout's bundle;
  # not Bundler (its Gemfile.lock pins one Puma).
  def env(version)
    clean = ENV.to_h.select { |k, _| k.start_with?("BUNDLE_", "BUNDLER_") || %w[RUBYOPT RUBYLIB].include?(k) }.transform_values { nil }
    clean.merge("GEM_HOME" => gems(version), "GEM_PATH" => [gems(version), *Gem.path].join(File::PATH_SEPARATOR),
      "HERALD_DIR" => File.join(@dir, "store"), "OUT" => @dir)
  end

  def install(version)
    return if File.exist?(File.join(gems(version), "specifications", "puma-#{version}.gemspec"))
    FileUtils.mkdir_p(gems(version))
    out, st = Open3.capture2e(env(version), "gem", "install", "--no-document", "--install-dir", gems(version), "puma:#{version}")
    assert st.success?, "installing Puma #{version} failed:\n#{out}"
  end
end
