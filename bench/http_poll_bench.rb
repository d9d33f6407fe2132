# frozen_string_literal: true

# Poll requests/s: wrk on POST /message-bus/<id>/poll?dlp=t for a channel with 10 new messages (every
# reply carries the same 10), against message_bus 4.5.1's middleware on the same Puma settings. Both servers
# run at once and the wrk rounds alternate between them, so drifting load on a shared machine hits both.
# A last row measures Puma itself (a 404 from the app behind the middleware): the ceiling for any middleware.
require_relative "harness"
require_relative "support/http_servers"
require "herald"
require "json"
require "securerandom"
require "logger"
require "net/http"

SECONDS = [(3 * Bench::SCALE).round, 1].max
ROUNDS = [Bench::ROUNDS, 3].max
BODY = "%2Fbench%2Fpoll=0"
LUA = <<~LUA
  wrk.method = "POST"
  wrk.body = "#{BODY}"
  wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
  wrk.headers["X-Silence-Logger"] = "true"
LUA

# One wrk run: [requests/s, server CPU microseconds per request (user + system, from /proc/PID/stat)].
def wrk(url, script, pid)
  cpu = Bench.cpu_seconds(pid)
  out = IO.popen(["wrk", "-t1", "-c16", "-d#{SECONDS}s", "-s", script, url], &:read)
  cpu = Bench.cpu_seconds(pid) - cpu
  raise "wrk failed: #{out}" unless $?.success?
  raise "wrk saw errors: #{out}" if out.match?(/Socket errors|Non-2xx/) && !url.end_with?("/not-found")
  [Float(out[/Requests\/sec:\s+([\d.]+)/, 1]), cpu * 1e6 / Integer(out[/(\d+) requests in/, 1])]
end

# Publishes the 10 messages and checks that one poll returns exactly them.
def poll_url(name, server)
  10.times do |i|
    server.post("/test/publish", JSON.generate("channel" => "/bench/poll", "data" => {"n" => i, "text" => "message #{i}"}))
  end
  path = "/message-bus/#{SecureRandom.hex(16)}/poll?dlp=t"
  count = JSON.parse(server.post(path, BODY, content_type: "application/x-www-form-urlencoded").body).size
  raise "#{name}: a poll returned #{count} messages, expected 10" unless count == 10
  server.url + path
end

# The reply the middleware gave (headers and body), set as the prebuilt reply of the test server's
# /test/prebuilt route: Puma answering exactly those bytes from the app behind the middleware, with no work.
PREBUILT = "Puma answering the middleware's reply prebuilt (same headers and body)"
def prebuilt_url(server, poll)
  response = Net::HTTP.post(URI(poll), BODY, "Content-Type" => "application/x-www-form-urlencoded")
  headers = response.to_hash.except("content-length", "connection", "transfer-encoding").transform_values { |v| v.join("\n") }
  server.post("/test/prebuilt/set", JSON.generate("headers" => headers, "body" => response.body.force_encoding(Encoding::UTF_8)))
  server.url + "/test/prebuilt"
end

abort "bench/http_poll_bench.rb needs wrk (apt-get install wrk)" unless system("which wrk > /dev/null")

# BENCH_OLD_ROOT=/tmp/old adds a row of the middleware on Puma served by another tree's lib (made with
# `git archive main lib test/support | tar -x -C /tmp/old`), in the same alternating rounds: an A/B comparison
# that the machine's drifting load hits alike. Several trees: comma-separated.
OLD_ROOTS = ENV.fetch("BENCH_OLD_ROOT", "").split(",").map { |root| File.expand_path(root) }
IMPLS = Bench::IMPLS.merge(Bench::FRONT_IMPLS)
if Bench::IMPLS.value?("herald")
  OLD_ROOTS.each { |root| IMPLS["Herald middleware (#{File.basename(root)})"] = ["herald", [], root] }
end
IMPLS.empty? or Dir.mktmpdir("herald-wrk") do |tmp|
  script = File.join(tmp, "poll.lua")
  File.write(script, LUA)
  Bench.with_http_servers(IMPLS) do |servers|
    load_before = Bench.loadavg
    urls = servers.to_h { |name, server| [name, poll_url(name, server)] }
    pids = servers.transform_values(&:pid)
    floor_name = "Puma alone (404 from the app, same settings)"
    puma = servers.values_at(*Bench::IMPLS.keys).compact.last
    if puma
      urls[floor_name] = puma.url + "/not-found"
      pids[floor_name] = puma.pid
    end
    herald_puma = servers["Herald middleware"]
    if herald_puma
      urls[PREBUILT] = prebuilt_url(herald_puma, urls["Herald middleware"])
      pids[PREBUILT] = herald_puma.pid
    end
    rates = Hash.new { |h, k| h[k] = [] }
    cpu = Hash.new { |h, k| h[k] = [] }
    ROUNDS.times do
      urls.each do |name, url|
        rate, us = wrk(url, script, pids[name])
        rates[name] << rate
        cpu[name] << us
      end
    end
    floor_rates = rates.delete(floor_name)
    load_after = Bench.loadavg
    Bench.section("HTTP poll requests/s (wrk, 10 messages per reply)",
      note: "`wrk -t1 -c16 -d#{SECONDS}s` over loopback, median of #{ROUNDS} rounds, each round one run against every row in turn (load average #{load_before} before, #{load_after} after); POST " \
            "/message-bus/<id>/poll?dlp=t with body `/bench/poll=0` on a channel holding 10 messages (893-byte reply). " \
            "One process per server, #{Bench::THREADS} Puma (or app) threads. #{Bench.store_note} `herald server` " \
            "answers polls on its own event loop (Herald::Server::Front). The Puma row is Puma answering a 404 from the " \
            "app behind the middleware: no middleware on Puma can be faster than that. The prebuilt row is Puma answering, " \
            "from the app behind the middleware, the very headers and body the middleware answered: what Puma itself costs " \
            "for this reply. Server CPU per request (user + " \
            "system time of the server process over the round, /proc/PID/stat) follows each rate: it holds under load. " \
            "The middleware and `herald server` answer a poll they have answered before (the same channels and positions, " \
            "client id aside) from their reply cache (Herald::Rack::ReplyCache) while the store is unchanged, as every wrk " \
            "request here is; the row with the cache off is what a poll costs when it must be built (every client at its " \
            "own positions).") do |s|
      rates.each do |name, list|
        s.add(name, Bench.median(list), baseline: name.start_with?("message_bus"), unit: "req/s", samples: list,
          extra: format("%.0f us CPU/req", Bench.median(cpu[name])))
      end
      s.add(floor_name, Bench.median(floor_rates), unit: "req/s", samples: floor_rates, extra: format("%.0f us CPU/req", Bench.median(cpu[floor_name]))) if floor_rates
    end
    median_of = ->(name) { rates[name].empty? ? nil : Bench.median(rates[name]) }
    mb = median_of.call("message_bus 4.5.1 middleware")
    herald = median_of.call("Herald middleware")
    front = rates[Bench::FRONT_IMPLS.keys.first].then { |list| list.empty? ? nil : Bench.median(list) }
    if mb && front
      puts format("Target: herald server >= 4x message_bus on Puma (goal 6x): %.2fx (%s); server CPU per request %.0f us vs %.0f us (%.2fx less).\n",
        front / mb, {6 => "goal met", 4 => "met"}.find { |bar, _| front / mb >= bar }&.last || "missed",
        Bench.median(cpu[Bench::FRONT_IMPLS.keys.first]), Bench.median(cpu[Bench::IMPLS.keys.first]),
        Bench.median(cpu[Bench::IMPLS.keys.first]) / Bench.median(cpu[Bench::FRONT_IMPLS.keys.first]))
    end
    uncached = Bench::FRONT_IMPLS.keys[1]
    if mb && uncached && !rates[uncached].empty?
      puts format("Without its reply cache (every poll built by the middleware): %.2fx message_bus; %.0f us CPU per request.\n",
        Bench.median(rates[uncached]) / mb, Bench.median(cpu[uncached]))
    end
    if herald && floor_rates
      floor = Bench.median(floor_rates)
      puts format("Target: the middleware on Puma >= 85%% of Puma's own 404: %.0f%% (%s)%s. " \
        "Per request Herald adds %.0f us to Puma's %.0f us%s.\n", 100 * herald / floor,
        (herald / floor >= 0.85) ? "met" : "missed", mb ? format("; %.2fx message_bus", herald / mb) : "",
        1e6 / herald - 1e6 / floor, 1e6 / floor, mb ? format(", message_bus %.0f us", 1e6 / mb - 1e6 / floor) : "")
      OLD_ROOTS.each do |root|
        name = "Herald middleware (#{File.basename(root)})"
        old = median_of.call(name) or next
        puts format("%s: %.0f%% of Puma's 404 (%.0f us CPU/request; this tree %.0f us).\n", name, 100 * old / floor,
          Bench.median(cpu[name]), Bench.median(cpu["Herald middleware"]))
      end
      prebuilt = rates[PREBUILT].then { |list| list.empty? ? nil : Bench.median(list) }
      if prebuilt
        puts format("Puma answering the same reply prebuilt: %.0f%% of its 404 rate (%.0f vs %.0f us CPU/request); " \
          "the middleware reaches %.0f%% of that (%.0f us CPU/request).\n", 100 * prebuilt / floor, Bench.median(cpu[PREBUILT]),
          Bench.median(cpu[floor_name]), 100 * herald / prebuilt, Bench.median(cpu["Herald middleware"]))
      end
      puts
    end
  end
end

# The same poll through each middleware's #call with a Rack env and no server: the middleware's own cost
# and allocations, without Puma's share.
require "message_bus"
require "stringio"
require "rack"
require_relative "support/peers"

def poll_env
  {"REQUEST_METHOD" => "POST", "PATH_INFO" => "/message-bus/#{SecureRandom.hex(16)}/poll", "QUERY_STRING" => "dlp=t",
   "SERVER_PROTOCOL" => "HTTP/1.1", "CONTENT_TYPE" => "application/x-www-form-urlencoded", "HTTP_DONT_CHUNK" => "true",
   "rack.input" => StringIO.new(BODY.dup), "SCRIPT_NAME" => "", "SERVER_NAME" => "127.0.0.1", "SERVER_PORT" => "80",
   "rack.url_scheme" => "http"}
end

def call_polls(app, n, env)
  n.times do
    env["rack.input"].rewind
    _, _, body = app.call(env)
    body.close if body.respond_to?(:close)
  end
end

Dir.mktmpdir("herald-poll-inproc") do |dir|
  not_found = ->(_env) { [404, {}, ["not found"]] }
  mb = Bench.message_bus_memory
  mb.logger = Logger.new(nil)
  herald = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir))
  10.times { |i| [mb, herald].each { |bus| bus.publish("/bench/poll", {"n" => i, "text" => "message #{i}"}) } }
  mb_app = MessageBus::Rack::Middleware.new(not_found, message_bus: mb)
  herald_app = Herald::Rack::Middleware.new(not_found, bus: herald)
  uncached_app = Herald::Rack::Middleware.new(not_found, bus: herald, reply_cache: false)
  Bench.section("Poll through the middleware alone (Rack env, no server)",
    note: "The request of the section above (10 messages, dlp=t) as a Rack env handed to each middleware's `call`; " \
          "one thread. #{Bench.store_note}") do |s|
    s.measure("message_bus 4.5.1 middleware", ops: 5_000, baseline: true) { |n| call_polls(mb_app, n, poll_env) }
    s.measure("Herald middleware", ops: 5_000) { |n| call_polls(herald_app, n, poll_env) }
    s.measure("Herald middleware, reply cache off", ops: 5_000) { |n| call_polls(uncached_app, n, poll_env) }
  end
  herald_app.close
  uncached_app.close
  herald.close
  mb.destroy
end
