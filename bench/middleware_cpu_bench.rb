# frozen_string_literal: true

# What the middleware's own Ruby costs for one request, without Puma's share and without the machine's load:
# each row calls an app's `call` in a loop with the env Puma builds for bench/http_poll_bench.rb's wrk request
# (captured from a real Puma::Server in this process: the same headers, a fresh StringIO as rack.input, the
# hijack procs), and reports per call:
#
# - objects allocated (GC.stat total_allocated_objects);
# - CPU instructions (valgrind --tool=callgrind, instrumentation switched on around the loop only), with
#   BENCH_CALLGRIND=1: each row then runs twice more in a child process under valgrind (slow: ~2 minutes);
# - with it, cache misses per call when the call runs cold, as between two of Puma's requests: callgrind's
#   cache simulation (a 1 MiB last-level cache) with a 4 MiB memory sweep before each call. Misses in the last
#   level (code and data fetched from farther away), minus the bare 404's: under Puma the middleware's
#   CPU time follows these far more than its instruction count (a 10k-instruction cut took ~1.5 us of ~20);
# - time (thread CPU time, median of BENCH_ROUNDS interleaved rounds): depends on the machine, unlike the two above.
#
# Rows: a bare 404 app (the floor: what Puma's 404 row runs), the middleware in front of it on a path it does
# not serve (/not-found, the 404 row of the wrk bench), the test server's prebuilt reply behind the middleware
# (the wrk bench's prebuilt row), and the middleware answering the poll from its reply cache (10 messages,
# dlp=t: every wrk request). The middleware's own cost is its row minus the bare 404's.
#
#   bundle exec ruby bench/middleware_cpu_bench.rb
#   BENCH_CALLGRIND=1 bundle exec ruby bench/middleware_cpu_bench.rb
#   BENCH_LIB=/tmp/old/lib ...   another tree's lib (`git archive main lib | tar -x -C /tmp/old`), for a before/after
require_relative "harness"
$LOAD_PATH.unshift(File.expand_path(ENV["BENCH_LIB"])) if ENV["BENCH_LIB"]
require "herald"
require "herald/server"
require "rack"
require "socket"
require "stringio"
require "tmpdir"
require "json"
require "rbconfig"

BODY = "%2Fbench%2Fpoll=0" # bench/http_poll_bench.rb's
CALLS = [(Integer(ENV.fetch("BENCH_MW_CALLS", "20000")) * Bench::SCALE).to_i, 100].max
# What wrk sends with bench/http_poll_bench.rb's Lua script (its Host header, the script's headers, Content-Length).
def wrk_request(path, port)
  "POST #{path} HTTP/1.1\r\nHost: 127.0.0.1:#{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n" \
    "X-Silence-Logger: true\r\nContent-Length: #{BODY.bytesize}\r\n\r\n#{BODY}"
end

# The env a real Puma (Herald::Server.build_puma, as the wrk bench's servers) hands the app for that request.
def puma_env(path)
  captured = Queue.new
  app = lambda do |env|
    captured << env.merge("rack.input" => nil)
    [404, {}, ["not found"]]
  end
  puma = Herald::Server.build_puma(app, host: "127.0.0.1", port: 0, threads: 1)
  puma.run
  port = puma.connected_ports.first
  Socket.tcp("127.0.0.1", port) do |s|
    s.write(wrk_request(path, port))
    s.readpartial(4096)
  end
  env = captured.pop
  puma.stop(true)
  env
end

# One call as Puma makes it: a fresh env (Puma dups its prototype per request) with the body in a new StringIO.
def call_loop(app, proto, n)
  i = 0
  while i < n
    env = proto.dup
    env["rack.input"] = StringIO.new(BODY.dup)
    _, _, body = app.call(env)
    body.close if body.respond_to?(:close)
    i += 1
  end
end

def thread_cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)

def objects_per_call(app, proto, n)
  GC.disable
  before = GC.stat(:total_allocated_objects)
  call_loop(app, proto, n)
  (GC.stat(:total_allocated_objects) - before).fdiv(n)
ensure
  GC.enable
end

# The apps of every row, on one bus with the wrk bench's 10 messages.
def build_rows(dir)
  bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir))
  10.times { |i| bus.publish("/bench/poll", {"n" => i, "text" => "message #{i}"}) }
  not_found = ->(_env) { [404, {}, ["not found"]] }
  middleware = Herald::Rack::Middleware.new(not_found, bus: bus)
  poll_path = "/message-bus/#{"a" * 32}/poll"
  poll = puma_env(poll_path).merge("QUERY_STRING" => "dlp=t", "REQUEST_URI" => "#{poll_path}?dlp=t")
  reply = call_loop_once(middleware, poll)
  prebuilt_headers = reply[1].to_h.freeze
  prebuilt_body = reply[2].join.freeze
  prebuilt = Herald::Rack::Middleware.new(->(_env) { [200, prebuilt_headers.dup, [prebuilt_body]] }, bus: bus)
  miss = puma_env("/not-found")
  raise "the poll did not return the 10 messages" unless JSON.parse(prebuilt_body).size == 10
  rows = {
    "bare 404 app (Puma's 404 row without the middleware)" => [not_found, miss],
    "middleware in front of the 404 app, /not-found" => [middleware, miss],
    "prebuilt reply behind the middleware (the wrk prebuilt row)" => [prebuilt, puma_env("/test/prebuilt")],
    "middleware poll answered from its reply cache" => [middleware, poll]
  }
  [rows, bus]
end

def call_loop_once(app, proto)
  env = proto.dup
  env["rack.input"] = StringIO.new(BODY.dup)
  app.call(env)
end

SWEEP = ("y" * (4 * 1024 * 1024)).freeze

# The calls with a 4 MiB memory sweep before each (String#index of a byte it does not hold reads it all).
def cold_loop(app, proto, n)
  n.times do
    SWEEP.index("x")
    call_loop(app, proto, 1)
  end
end

# Instructions (or, cold, cache misses) per call of one row, measured in this process (under valgrind).
def callgrind_child(rows, name)
  app, proto = rows.fetch(name)
  cold = ENV["BENCH_CALLGRIND_COLD"]
  call_loop(app, proto, 2000) # warm: caches filled, methods compiled to their inline caches
  n = Integer(ENV.fetch("BENCH_CALLGRIND_CALLS", cold ? "500" : "5000"))
  system("callgrind_control", "--instr=on", Process.pid.to_s, out: File::NULL, exception: true)
  cold ? cold_loop(app, proto, n) : call_loop(app, proto, n)
  system("callgrind_control", "--instr=off", Process.pid.to_s, out: File::NULL, exception: true)
  File.write(ENV.fetch("BENCH_CALLGRIND_RESULT"), n.to_s)
end

# Warm: instructions per call. Cold: last-level cache misses per call (instruction fetches, data reads and
# writes), the sweep's own included (the same in every row: compare rows, not absolute figures).
def callgrind_per_call(name, cold: false)
  Dir.mktmpdir("herald-callgrind") do |tmp|
    out = File.join(tmp, "callgrind.out")
    result = File.join(tmp, "calls")
    sim = cold ? ["--cache-sim=yes", "--LL=1048576,16,64"] : []
    ok = system({"BENCH_CALLGRIND_ROW" => name, "BENCH_CALLGRIND_RESULT" => result, "BENCH_CALLGRIND_COLD" => cold ? "1" : nil},
      "valgrind", "--tool=callgrind", *sim, "--instr-atstart=no", "--callgrind-out-file=#{out}",
      RbConfig.ruby, __FILE__, err: File::NULL, out: File::NULL)
    raise "valgrind failed for #{name}" unless ok && File.exist?(result)
    text = File.read(out)
    events = text[/^events:(.*)$/, 1].split
    totals = text[/^totals:(.*)$/, 1].split.map { |v| Integer(v) }
    counts = events.zip(totals).to_h
    value = cold ? counts.values_at("ILmr", "DLmr", "DLmw").sum : counts.fetch("Ir")
    value.fdiv(Integer(File.read(result)))
  end
end

Dir.mktmpdir("herald-mw-cpu") do |dir|
  rows, bus = build_rows(dir)
  if (name = ENV["BENCH_CALLGRIND_ROW"])
    callgrind_child(rows, name)
    next
  end
  load_before = Bench.loadavg
  rows.each_value { |app, proto| call_loop(app, proto, CALLS / 10) } # warm-up
  objects = rows.transform_values { |app, proto| objects_per_call(app, proto, CALLS / 10) }
  times = Hash.new { |h, k| h[k] = [] }
  Bench::ROUNDS.times do
    rows.each do |row, (app, proto)|
      started = thread_cpu
      call_loop(app, proto, CALLS)
      times[row] << (thread_cpu - started) * 1e6 / CALLS
    end
  end
  instructions = ENV["BENCH_CALLGRIND"] ? rows.keys.to_h { |row| [row, callgrind_per_call(row)] } : {}
  misses = ENV["BENCH_CALLGRIND"] ? rows.keys.to_h { |row| [row, callgrind_per_call(row, cold: true)] } : {}
  floor = rows.keys.first
  puts "### The middleware's own cost per request (Rack env as Puma builds it, no server)\n\n"
  puts "`bench/middleware_cpu_bench.rb`: each app's `call` in a loop with the env a real Puma built for the wrk " \
    "request of bench/http_poll_bench.rb (fresh env copy and StringIO body per call, as Puma); #{CALLS} calls a round, " \
    "thread CPU time, median of #{Bench::ROUNDS} interleaved rounds; objects per call from GC.stat; instructions per " \
    "call from callgrind around the loop only, and last-level cache misses per call run cold (callgrind's cache " \
    "simulation, 1 MiB LL, a 4 MiB sweep before each call)#{" (neither measured: BENCH_CALLGRIND=1)" if instructions.empty?}. " \
    "Load average #{load_before} before, #{Bench.loadavg} after. \"over 404\": the row minus the bare 404 app.\n\n"
  puts "| | CPU per call | over 404 | objects per call | over 404 | instructions per call | over 404 | cold: cache misses per call over 404 |"
  puts "|---|---:|---:|---:|---:|---:|---:|---:|"
  rows.each_key do |row|
    us = Bench.median(times[row])
    ins = instructions[row]
    miss = misses[row]
    puts format("| %s | %.2f us | %+.2f us | %.1f | %+.1f | %s | %s | %s |", row, us, us - Bench.median(times[floor]),
      objects[row], objects[row] - objects[floor], ins ? ins.round.to_s : "-", ins ? format("%+d", (ins - instructions[floor]).round) : "-",
      miss ? format("%+d", (miss - misses[floor]).round) : "-")
  end
  puts
  rows.each_value { |app, _| app.close if app.respond_to?(:close) }
  bus.close
end
