# frozen_string_literal: true

# A server for the browser tests and the HTTP benchmarks, with the same Puma settings as `herald server`
# (Herald::Server.build_puma) and the same demo app, in front of either implementation:
#
#   ruby test/support/http_server.rb --impl herald|message_bus [--port 0] [--dir DIR] [--store log|memory]
#     [--threads 5] [--user-cookie NAME] [--max-clients N] [--trace] [--workers N] [--front herald|puma]
#
# --user-cookie NAME makes the user id the value of cookie NAME: test-only wiring for targeted delivery
# (a real app derives the user from its session). It prints "listening <port>" once it accepts connections
# and stops on SIGTERM/SIGINT. --trace (Herald only, for bench/http_latency_bench.rb) records the server-side
# timing of every fan-out in DIR (bench/support/fan_out_trace.rb). --workers N (Herald only): N server
# processes on one port, as `herald server --workers N` (Herald::Server::Workers). --front (Herald only): Herald's own front
# end (Herald::Server::Front, as `herald server`) or Puma in front of the middleware (how an app embeds Herald,
# the default here); HERALD_TEST_FRONT=herald|puma sets the default (bin/test runs the browser tests with herald).
# --no-reply-cache: herald server's front end without its ReplyCache (benchmarks).
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "optparse"
require "logger"
require "rack"
require "herald"
require "herald/server"

options = {impl: "herald", port: 0, dir: nil, store: "log", threads: Herald::Server::DEFAULT_THREADS,
           user_cookie: nil, max_clients: nil, trace: false, workers: 1,
           front: ENV.fetch("HERALD_TEST_FRONT", "puma")}
OptionParser.new do |o|
  o.on("--impl NAME") { |v| options[:impl] = v }
  o.on("--port PORT", Integer) { |v| options[:port] = v }
  o.on("--dir DIR") { |v| options[:dir] = v }
  o.on("--store NAME") { |v| options[:store] = v }
  o.on("--threads N", Integer) { |v| options[:threads] = v }
  o.on("--user-cookie NAME") { |v| options[:user_cookie] = v }
  o.on("--max-clients N", Integer) { |v| options[:max_clients] = v }
  o.on("--trace") { options[:trace] = true }
  o.on("--workers N", Integer) { |v| options[:workers] = v }
  o.on("--front NAME", %w[herald puma]) { |v| options[:front] = v }
  o.on("--no-reply-cache") { options[:reply_cache] = false }
  o.on("--long-poll-ms MS", Integer) { |v| options[:long_poll_ms] = v }
end.parse!(ARGV)

# POST /test/publish {"channel":..., "data":..., "user_ids":[...], "group_ids":[...]}: targeted publishing
# for the tests, in front of the demo app. Test-only: `herald server` has no such route.
# POST /test/prebuilt/set {"headers": {...}, "body": "..."}, then any request to /test/prebuilt: that reply,
# prebuilt (bench/http_poll_bench.rb: what the server costs for a poll's reply with no work for it).
class TestPublish
  PREBUILT = "/test/prebuilt"

  def initialize(app, bus)
    @app = app
    @bus = bus
  end

  def call(env)
    return prebuilt(env) if env["PATH_INFO"].start_with?(PREBUILT)
    return @app.call(env) unless env["PATH_INFO"] == "/test/publish" && env["REQUEST_METHOD"] == "POST"
    stamp = Process.clock_gettime(Process::CLOCK_REALTIME)
    body = JSON.parse(env["rack.input"].read)
    # A benchmark's message ({"t" => client clock}) gets the server's own clock too (fan_out_trace.rb).
    body["data"]["st"] = stamp if body["data"].is_a?(Hash) && body["data"].key?("t")
    targets = body.slice("user_ids", "group_ids", "client_ids").transform_keys(&:to_sym)
    id = @bus.publish(body.fetch("channel"), body.fetch("data"), **targets)
    [201, {"content-type" => "application/json"}, [JSON.generate("message_id" => id)]]
  end

  def prebuilt(env)
    if env["PATH_INFO"] == "#{PREBUILT}/set"
      set = JSON.parse(env["rack.input"].read)
      @prebuilt = [set.fetch("headers").freeze, set.fetch("body").b.freeze]
      return [204, {}, []]
    end
    headers, body = @prebuilt
    [200, headers.dup, [body]]
  end
end

user_lookup = if (cookie = options[:user_cookie])
  lambda do |env|
    value = ::Rack::Utils.parse_cookies(env)[cookie]
    value && Integer(value, exception: false)
  end
end

case options[:impl]
when "herald"
  lookups = {user_id_lookup: user_lookup}.compact
  lookups[:max_active_clients] = options[:max_clients] if options[:max_clients]
  common = {host: "127.0.0.1", port: options[:port], threads: options[:threads], app: ->(app, bus) { TestPublish.new(app, bus) },
            front: options[:front].to_sym, reply_cache: options.fetch(:reply_cache, true), **lookups}
  started = lambda do |server|
    next unless options[:trace]
    require_relative "../../bench/support/fan_out_trace"
    server.app.reactor.trace = Bench::FanOutTrace.new(options.fetch(:dir))
  end
  if options[:workers] > 1
    # `herald server --workers N`'s own code; its first worker prints "Herald listening on ...".
    abort "--workers needs the log store" unless options[:store] == "log"
    exit Herald::Server::Workers.new(options[:workers], dir: options.fetch(:dir), log: $stdout, **common, &started).run
  end
  store = (options[:store] == "memory") ? Herald::Store::Memory.new : Herald::Store::Log.new(dir: options.fetch(:dir))
  server = Herald::Server.new(store: store, log: nil, **common)
  server.start
  started.call(server)
  puts "listening #{server.port}"
  $stdout.flush
  server.wait
when "message_bus"
  require "message_bus"
  bus = MessageBus::Instance.new
  bus.configure(backend: :memory)
  bus.user_id_lookup(&user_lookup) if user_lookup
  bus.max_active_clients = options[:max_clients] if options[:max_clients]
  bus.logger = Logger.new(nil)
  # message_bus registers a held poll only after reading its backlog and writing it (its own "TODO disable client till
  # deliver backlog is called"): a message published in that gap reaches the client at the poll's end, not
  # at once. A shorter poll bounds that wait for tests that publish right after the first reply.
  bus.long_polling_interval = options[:long_poll_ms] if options[:long_poll_ms]
  app = MessageBus::Rack::Middleware.new(TestPublish.new(Herald::Server::DemoApp.new(bus: bus), bus),
    message_bus: bus)
  puma = Herald::Server.build_puma(app, host: "127.0.0.1", port: options[:port], threads: options[:threads])
  puma.run
  puts "listening #{puma.connected_ports.first}"
  $stdout.flush
  stop = Queue.new
  %w[TERM INT].each { |sig| trap(sig) { stop << sig } }
  stop.pop
  puma.stop(true)
  bus.destroy
else
  abort "unknown --impl #{options[:impl].inspect} (herald or message_bus)"
end
