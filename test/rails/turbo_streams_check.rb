# frozen_string_literal: true

# The Rails app test's Turbo Streams check (RailsAppTest includes it; #production calls it for the default app,
# whose `rails new` brings turbo-rails and ActionCable, and whose config/cable.yml the generator set to
# `adapter: herald`). Uses what RailsAppTest has: @run, #run!, #puma_workers, #log, #monotonic, @pids.
module TurboStreamsCheck
  TURBO_TEXT = "héllo 日本語 🎉 — «turbo»"
  # Over 1 MB of UTF-8 in one broadcast.
  TURBO_BIG_UNIT = "é🎉"
  TURBO_BIG_REPEAT = (1 << 20) / TURBO_BIG_UNIT.bytesize + 1

  # Pages are opened until the WebSockets of both Puma workers stream "room" (log/cable.txt names the process
  # of each confirmation); `broadcast_append_to` from `bin/rails runner` (another process, through the app's
  # Herald store) appears live in every page, once; then a broadcast of over 1 MB does too, whole.
  #
  # `variant:` (a label) and a block: another cable.yml than the generator's (Herald on Redis, Solid Cable kept);
  # the block runs after the first check (a Redis restart), then one more broadcast must reach every page, once.
  # `flush:` Ruby the runner runs after its broadcasts (Solid Cable writes them from a background thread).
  def check_turbo_streams(variant: nil, flush: "", &between)
    started = monotonic
    app = @run[:app]
    assert_generators_cable_yml(app) unless variant
    stdin, stdout, wait = Open3.popen2({"NODE_PATH" => File.join(self.class::ROOT, "node_modules")}, "node",
      File.join(__dir__, "turbo_check.mjs"), @run[:url], File.join(self.class::ARTIFACTS, name), ["production", @rails, variant].compact.join("-"), chdir: self.class::ROOT)
    @pids << wait.pid
    opened = open_turbo_pages_on_every_worker(app, stdin, stdout)
    run!(app, "bin/rails", "runner", <<~RUBY)
      Turbo::StreamsChannel.broadcast_append_to("room", target: "messages", html: %(<p id="m1">#{TURBO_TEXT}</p>))
      Turbo::StreamsChannel.broadcast_append_to("room", target: "messages", html: %(<p id="big">) + #{TURBO_BIG_UNIT.inspect} * #{TURBO_BIG_REPEAT} + "</p>")
      #{flush}
    RUBY
    stdin.puts "expect #{JSON.generate(ids: %w[m1 big])}"
    assert_turbo_pages(JSON.parse(Timeout.timeout(120) { stdout.gets }.to_s), opened)
    if between
      between.call
      run!(app, "bin/rails", "runner", %(Turbo::StreamsChannel.broadcast_append_to("room", target: "messages", html: %(<p id="m2">#{TURBO_TEXT}</p>))\n#{flush}))
      stdin.puts "expect #{JSON.generate(ids: %w[m1 big m2])}"
      pages = JSON.parse(Timeout.timeout(120) { stdout.gets }.to_s)
      pages.each { |page| assert_equal [1, TURBO_TEXT], page["items"][2].values_at("count", "text"), "page rendered by #{page["pid"]}: the broadcast after #{variant}'s interruption, once" }
    end
    stdin.close
    wait.value # the browser closed its WebSockets: Puma's later stop does not wait for them
    stored = variant ? "" : " (#{cable_publishes(app).max} bytes stored for the large one)"
    log "Turbo Streams#{" (#{variant})" if variant}: #{opened} pages, WebSockets on workers #{cable_confirmations(app).tally}, " \
      "every broadcast once in every page#{stored} in #{(monotonic - started).round(1)} s"
  ensure
    # On a failure, the browser goes first: Puma's graceful stop would wait for its open WebSockets.
    stdin&.close unless stdin&.closed?
    Process.kill(:TERM, wait.pid) if wait&.alive?
  end

  private

  def assert_generators_cable_yml(app)
    cable = YAML.safe_load(ERB.new(File.read(File.join(app, "config", "cable.yml"))).result, aliases: true)
    assert_equal %w[herald test herald], cable.values_at("development", "test", "production").map { |e| e["adapter"] }, "the generator's cable.yml"
  end

  def open_turbo_pages_on_every_worker(app, stdin, stdout)
    workers = puma_workers(@run[:puma_log])
    opened = 0
    until (workers - cable_confirmations(app)).empty?
      flunk "#{opened} Turbo pages and no WebSocket on every worker (#{cable_confirmations(app).tally})" if opened == 24
      stdin.puts "open"
      assert_match(/\Aopened \d+\n\z/, Timeout.timeout(60) { stdout.gets }.to_s)
      opened += 1
    end
    opened
  end

  def cable_confirmations(app)
    file = File.join(app, "log", "cable.txt")
    File.exist?(file) ? File.readlines(file).map { |l| Integer(l.split[0]) } : []
  end

  def assert_turbo_pages(pages, opened)
    assert_equal opened, pages.size
    utf16_units = (TURBO_BIG_UNIT * TURBO_BIG_REPEAT).encode("UTF-16LE").bytesize / 2 # JavaScript's String#length
    pages.each do |page|
      small, big = page["items"]
      assert_equal [1, TURBO_TEXT], [small["count"], small["text"]], "page rendered by #{page["pid"]}: the runner's broadcast, once"
      assert_equal [1, utf16_units], [big["count"], big["length"]], "page rendered by #{page["pid"]}: the 1 MB broadcast, once, whole"
    end
  end

  # The runner's two broadcasts went through the app's Herald store (its publish_message.herald notifications).
  def cable_publishes(app)
    notes = File.readlines(File.join(app, "log", "herald_notifications.txt")).map { |l| JSON.parse(l) }
    sizes = notes.select { |n| n["name"] == "publish_message.herald" && n["channel"].to_s.match?(%r{\A/herald/cable/(\w+:)?room\z}) }.map { |n| n["bytes"] }
    assert_equal 2, sizes.size, "publish_message.herald for each broadcast"
    assert_operator sizes.max, :>, 1 << 20
    sizes
  end
end
