# frozen_string_literal: true

# ActionCable across processes: `ActionCable.server.broadcast` in one process -> the subscriber's callback in
# another (ActionCable's own pubsub callback, on its executor, as `stream_from` gets it), for ActionCable's
# Redis and PostgreSQL adapters and `adapter: herald` on the embedded log, Redis and PostgreSQL.
#
#   BUNDLE_GEMFILE=gemfiles/actioncable_bench.gemfile bundle exec ruby bench/actioncable_bench.rb
#
# Each row has one publisher and one subscriber process (started once). A round: COUNT broadcasts (BENCH_COUNT,
# 300) PAUSE seconds apart (BENCH_PAUSE, 0.005), each stamped with the wall clock before its broadcast; the
# subscriber records when its callback ran. Rows run interleaved, round by round (BENCH_ROUNDS, 5), so a change
# in the machine's load hits every row alike; the table gives the median over rounds of each round's p50 and p99,
# with the spread (min-max), and every round's missing (not there 5 s after the last broadcast), duplicated
# and out-of-order broadcasts, summed. BENCH_ROWS=regexp picks rows.
# BENCH_SIZE: payload bytes (200). BENCH_BASE_LIB=DIR adds a row for each Herald row with Herald's lib/ from DIR
# (another checkout's, e.g. `git archive main lib | tar -x -C DIR`), interleaved with this one's: an A/B in one run.
# Servers: test/support/servers.rb (REDIS_URL / DATABASE_URL to use others).
require "json"
require "open3"
require "rbconfig"
require "tmpdir"
require_relative "harness"
require_relative "../test/support/servers"

COUNT = Integer(ENV.fetch("BENCH_COUNT", "300"))
PAUSE = Float(ENV.fetch("BENCH_PAUSE", "0.005"))
SIZE = Integer(ENV.fetch("BENCH_SIZE", "200"))
LIB = File.expand_path("../lib", __dir__)

BOOT = <<~RUBY
  require "json"
  require "logger"
  require "concurrent"
  require "active_support"
  require "active_support/core_ext/string/inflections"
  require "active_support/core_ext/hash/indifferent_access"
  require "action_cable"
  cable = JSON.parse(ENV.fetch("CABLE"))
  if cable["adapter"] == "postgresql" # ActionCable's PostgreSQL adapter goes through ActiveRecord's pool
    require "active_record"
    ActiveRecord::Base.establish_connection(ENV.fetch("PG_URL"))
  end
  server = ActionCable::Server::Base.new
  server.config.cable = cable.with_indifferent_access
  server.config.logger = Logger.new(IO::NULL)
  $stdout.sync = true
RUBY

# Commands on stdin: "round R" starts recording round R (answers "ok"); "report" prints [[n, latency seconds], ...].
SUBSCRIBER = <<~RUBY
  #{BOOT}
  round = nil
  got = []
  lock = Mutex.new
  on_message = lambda do |payload|
    now = Process.clock_gettime(Process::CLOCK_REALTIME)
    m = JSON.parse(payload)
    lock.synchronize { got << [m["n"], now - m["t"]] if m["r"] == round }
  end
  server.pubsub.subscribe("bench", on_message, -> { puts "ready" })
  while (line = $stdin.gets)
    command, arg = line.split
    case command
    when "round"
      lock.synchronize { round = Integer(arg); got = [] }
      puts "ok" # before the publisher starts: a broadcast of this round is never taken for the last one's
    when "report" # what the round sent, or what came within 5 s: a late one is counted, a lost one missing
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      sleep 0.01 until lock.synchronize { got.size } >= Integer(ENV.fetch("COUNT")) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.2 # a duplicate would come now
      puts JSON.generate(lock.synchronize { got })
    end
  end
  server.pubsub.shutdown
RUBY

# "go R" broadcasts COUNT stamped messages PAUSE apart, then prints "done".
PUBLISHER = <<~RUBY
  #{BOOT}
  pad = "x" * Integer(ENV.fetch("SIZE"))
  server.broadcast("bench", {"r" => -1, "n" => 0, "t" => 0, "pad" => pad}) # connects before the first round
  puts "ready"
  while (line = $stdin.gets)
    round = Integer(line.split[1])
    Integer(ENV.fetch("COUNT")).times do |n|
      server.broadcast("bench", {"r" => round, "n" => n, "t" => Process.clock_gettime(Process::CLOCK_REALTIME), "pad" => pad})
      sleep Float(ENV.fetch("PAUSE"))
    end
    puts "done"
  end
  server.pubsub.shutdown
RUBY

Worker = Struct.new(:stdin, :stdout, :thread) do
  # A worker that does not start (ActionCable's PostgreSQL adapter refuses payloads over 8,000 bytes) raises
  # the first error line it printed.
  def self.start(script, env, lib: LIB)
    errors = File.join(Dir.tmpdir, "cable-bench-#{Process.pid}-#{rand(1 << 30)}.err")
    stdin, stdout, thread = Open3.popen2(env, RbConfig.ruby, "-I", lib, "-e", script, err: errors)
    line = stdout.gets
    unless line == "ready\n"
      thread.value
      raise File.read(errors)[/\(PG::\w+\)|\w+(::\w+)*Error\b.*$/].to_s + " " + File.read(errors)[/ERROR:\s+([^\n(]+)/, 1].to_s
    end
    new(stdin, stdout, thread)
  ensure
    File.delete(errors) if errors && File.exist?(errors) && line == "ready\n"
  end

  def ask(line)
    stdin.puts(line)
    stdout.gets
  end

  def stop
    stdin.close
    thread.value
  end
end

def pct(sorted, p) = sorted[((sorted.size - 1) * p).round]

def ms(seconds) = format("%.2f", seconds * 1000)

redis = Herald::TestServers.redis_url
postgres = Herald::TestServers.postgres_url
dir = Dir.mktmpdir("herald-cable-bench")
rows = {
  "ActionCable redis adapter" => {"adapter" => "redis", "url" => redis, "channel_prefix" => "bench"},
  "ActionCable postgresql adapter" => {"adapter" => "postgresql"},
  "Herald, embedded log" => {"adapter" => "herald", "store" => dir},
  "Herald, Redis" => {"adapter" => "herald", "store" => redis, "namespace" => "cable_bench"},
  "Herald, PostgreSQL" => {"adapter" => "herald", "store" => postgres, "table" => "cable_bench"}
}
rows.select! { |name, _| name.match?(Regexp.new(ENV["BENCH_ROWS"], Regexp::IGNORECASE)) } if ENV["BENCH_ROWS"] # e.g. "herald"
BASE_LIB = ENV["BENCH_BASE_LIB"] && File.expand_path(File.join(ENV["BENCH_BASE_LIB"], "lib"))
if BASE_LIB
  rows = rows.flat_map do |name, cable|
    row = [[name, cable]]
    # Its own namespace, table or directory: neither row's subscriber hears the other's broadcasts.
    own = cable.to_h { |k, v| [k, %w[namespace table].include?(k) ? "#{v}_base" : v] }
    own["store"] = "#{dir}-base" if cable["store"] == dir
    row << ["#{name} (base: #{ENV["BENCH_BASE_LIB"]})", own.merge("lib" => BASE_LIB)] if cable["adapter"] == "herald"
    row
  end.to_h
end
load_before = Bench.loadavg
results = rows.keys.to_h { |name| [name, {p50: [], p99: [], missing: 0, duplicated: 0, out_of_order: 0}] }
workers = rows.to_h do |name, cable|
  env = {"CABLE" => JSON.generate(cable), "PG_URL" => postgres, "COUNT" => COUNT.to_s, "PAUSE" => PAUSE.to_s, "SIZE" => SIZE.to_s}
  lib = cable.delete("lib") || LIB
  env["CABLE"] = JSON.generate(cable)
  [name, [Worker.start(SUBSCRIBER, env, lib: lib), Worker.start(PUBLISHER, env, lib: lib)]]
rescue => e
  results[name][:failure] = e.message
  [name, nil]
end.compact
Bench::ROUNDS.times do |round|
  workers.each do |name, (subscriber, publisher)|
    subscriber.ask("round #{round}")
    publisher.ask("go #{round}")
    got = JSON.parse(subscriber.ask("report"))
    r = results[name]
    numbers = got.map(&:first)
    missing = (0...COUNT).reject { |n| numbers.include?(n) }
    warn "#{name}, round #{round}: missing #{missing.inspect}" if missing.any?
    r[:missing] += missing.size
    r[:duplicated] += numbers.size - numbers.uniq.size
    r[:out_of_order] += numbers.each_cons(2).count { |a, b| b < a }
    latencies = got.map(&:last).sort
    r[:p50] << pct(latencies, 0.5) if latencies.any?
    r[:p99] << pct(latencies, 0.99) if latencies.any?
  end
end
workers.each_value { |pair| pair.each(&:stop) }
FileUtils.rm_rf([dir, "#{dir}-base"])

base = results["ActionCable redis adapter"] && Bench.median(results["ActionCable redis adapter"][:p50])
puts "### ActionCable: broadcast in one process -> subscriber callback in another", ""
puts "#{RUBY_DESCRIPTION}; actioncable #{Gem.loaded_specs["actioncable"]&.version}. #{Bench::ROUNDS} rounds of #{COUNT} broadcasts " \
  "of #{SIZE} B payload, #{PAUSE * 1000} ms apart, rows interleaved. Load average #{load_before} before, #{Bench.loadavg} " \
  "after: the machine (2 cores) was shared with other work, so the figures are loaded ones, not quiet ones.", ""
puts "| | p50 ms: median (spread) | p99 ms: median (spread) | p50 vs Redis adapter | missing / duplicated / out of order |"
puts "|---|---:|---:|---:|---:|"
results.each do |name, r|
  next puts "| #{name} | failed: #{r[:failure]} | | | |" if r[:failure]
  next puts "| #{name} | no data | | | #{r[:missing]} / #{r[:duplicated]} / #{r[:out_of_order]} |" if r[:p50].empty?
  p50 = Bench.median(r[:p50])
  puts "| #{name} | #{ms(p50)} (#{ms(r[:p50].min)}-#{ms(r[:p50].max)}) | #{ms(Bench.median(r[:p99]))} " \
    "(#{ms(r[:p99].min)}-#{ms(r[:p99].max)}) | #{base ? format("%.2fx", p50 / base) : "-"} | #{r[:missing]} / #{r[:duplicated]} / #{r[:out_of_order]} |"
end
