# frozen_string_literal: true

require "redis-client"
require_relative "../support/servers"

# The Rails app test's other config/cable.yml setups, each on a new Puma cluster over the same app (RailsAppTest
# includes it; #production calls it after the main run): ActionCable on Herald with a Redis store through a
# Redis restart, and (Rails 8) an app that keeps Rails' default Solid Cable beside Herald. Uses what
# RailsAppTest and TurboStreamsCheck have: @run, #run!, #start_puma, #check_turbo_streams, #check_logs, @pids.
module CableVariantsCheck
  REDIS_NAMESPACE = "herald_cable_app"
  # What the workers say, as they should, while Redis restarts: the lost connection, retried with backoff,
  # and the reset (a restart without persistence) noticed.
  REDIS_RESTART_LOG_LINES = [
    /ActionCable \(adapter: herald\): (reading broadcasts|confirming subscriptions) failed: Herald::(ConnectionError|TimeoutError): Redis at \S+ (is unreachable|did not answer in time)/,
    /Redis store #{REDIS_NAMESPACE} was reset \(epoch \S* -> \S+\): ids restart above the old ones/,
    /ActionCable \(adapter: herald\): the store was reset \(epoch /
  ].freeze

  # `store:` in cable.yml names a Redis (test/support/servers.rb's); the app adds the redis-client gem, as the
  # README says. A broadcast from `bin/rails runner` reaches the pages of both workers, then Redis restarts
  # (kill, no persistence: its data is gone) and the next broadcast reaches them all too, once.
  def check_cable_on_redis
    Herald::TestServers.require!(self, :redis)
    app = @run[:app]
    add_gem(app, "redis-client")
    url = Herald::TestServers.redis_url
    restart_with_cable("production-cable-redis", <<~YAML)
      development:
        adapter: herald
      test:
        adapter: test
      production:
        adapter: herald
        store: #{url}
        namespace: #{REDIS_NAMESPACE}
    YAML
    check_turbo_streams(variant: "herald-redis-restart") do
      refute_empty redis_keys(url), "the broadcasts are in Redis"
      Herald::TestServers.restart_redis!
    end
    refute_empty redis_keys(url), "the broadcast after the restart is in Redis"
    check_logs(@run[:puma_log], expected: REDIS_RESTART_LOG_LINES)
  end

  # `rails g herald:install --skip-cable` leaves the cable.yml of `rails new` (Solid Cable in production):
  # Turbo Streams go through Solid Cable (its messages table), and Herald works beside it.
  # Solid Cable 4 writes a broadcast from a background thread (BatchedBroadcaster): a `bin/rails runner` that
  # exits right after broadcasting may lose it (seen here: no page got it), so the runner flushes it by
  # shutting the adapter down. How many of a bare runner's broadcasts were written is logged.
  def check_solid_cable_kept
    app = @run[:app]
    cable = File.join(app, "config", "cable.yml")
    File.write(cable, @rails_new_cable)
    run!(app, "bin/rails", "generate", "herald:install", "--skip-cable", "--skip")
    assert_equal @rails_new_cable, File.read(cable), "--skip-cable leaves config/cable.yml as rails new wrote it"
    assert_equal "solid_cable", YAML.safe_load(ERB.new(@rails_new_cable).result, aliases: true).dig("production", "adapter")
    restart_with_cable("production-solid-cable", @rails_new_cable)
    before = solid_cable_messages(app)
    run!(app, "bin/rails", "runner", 'Turbo::StreamsChannel.broadcast_append_to("other", target: "messages", html: "<p>bare</p>")')
    bare = solid_cable_messages(app) - before
    log "Solid Cable: a runner that broadcast and exited: #{bare} of 1 broadcast written to its table"
    check_turbo_streams(variant: "solid-cable", flush: "ActionCable.server.pubsub.shutdown")
    assert_operator solid_cable_messages(app), :>=, before + bare + 2, "the broadcasts went through Solid Cable's table"
    check_herald_beside
    check_logs(@run[:puma_log])
  end

  private

  def solid_cable_messages(app) = Integer(run!(app, "bin/rails", "runner", 'print "COUNT:", SolidCable::Message.count')[/COUNT:(\d+)/, 1])

  def redis_keys(url)
    redis = RedisClient.new(url: url)
    redis.call("KEYS", "#{REDIS_NAMESPACE}:*")
  ensure
    redis&.close
  end

  def check_herald_beside
    text = "beside Solid Cable ü ✓ 🎉"
    run!(@run[:app], "bin/rails", "runner", "Herald.publish('/beside', {'text' => #{text.inspect}})")
    uri = URI("#{@run[:url]}/message-bus/beside-client/poll?dlp=t")
    response = Net::HTTP.post(uri, JSON.generate({"/beside" => 0}), "Content-Type" => "application/json")
    assert_equal "200", response.code
    received = JSON.parse(response.body.force_encoding(Encoding::UTF_8)).select { |m| m["channel"] == "/beside" }
    assert_equal [{"text" => text}], received.map { |m| m["data"] }, "Herald's message beside Solid Cable"
  end

  def restart_with_cable(label, yaml)
    stop_puma(@run[:puma_pid])
    File.write(File.join(@run[:app], "config", "cable.yml"), yaml)
    port, puma_log, puma_pid = start_puma(@run[:app], label: label)
    @run = @run.merge(url: "http://127.0.0.1:#{port}", puma_log: puma_log, puma_pid: puma_pid)
  end

  def stop_puma(pid)
    Process.kill(:TERM, pid)
    Timeout.timeout(60) { Process.wait(pid) }
    @pids.delete(pid)
  end

  # The gem in the Rails gems directory (installed once), a Gemfile line, `bundle install`.
  def add_gem(app, name)
    run!(app, "gem", "install", "--conservative", "--no-document", name) if Dir[File.join(gems, "specifications", "#{name}-*.gemspec")].empty?
    gemfile = File.join(app, "Gemfile")
    File.write(gemfile, "#{File.read(gemfile)}gem #{name.inspect}\n") unless File.read(gemfile).include?(%(gem #{name.inspect}))
    run!(app, "bundle", "install", "--local")
  end
end
