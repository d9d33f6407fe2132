# frozen_string_literal: true

# Herald's Redis and PostgreSQL stores against message_bus's Redis and PostgreSQL backends on the SAME
# servers (spawned by test/support/servers.rb, or REDIS_URL / DATABASE_URL), and the publish -> wakeup
# latency between two processes for every store.
require_relative "harness"
require_relative "support/peers"
require_relative "../test/support/servers"
require "herald"
require "tmpdir"
require "uri"

DATA = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
CHANNEL = "/test/channel"
redis_url = Herald::TestServers.redis_url
pg_url = Herald::TestServers.postgres_url

def message_bus_redis(url)
  bus = MessageBus::Instance.new
  bus.configure(backend: :redis, redis_config: {url: url})
  bus.backend_instance.max_backlog_size = 1000
  bus.backend_instance.reset!
  bus
end

def message_bus_postgres(url)
  uri = URI(url)
  bus = MessageBus::Instance.new
  bus.configure(backend: :postgres, backend_options: {host: uri.host, port: uri.port, user: uri.user, dbname: uri.path.delete_prefix("/")})
  bus.backend_instance.max_backlog_size = 1000
  bus.backend_instance.reset!
  bus
end

THREADS = 4
# Only some parts: BENCH_PARTS=redis,postgres,wakeup (the default: all).
PARTS = ENV.fetch("BENCH_PARTS", "redis,postgres,wakeup").split(",")

# n operations spread over THREADS threads. Every thread is joined before the first error is raised, so a
# failing row (message_bus's PostgreSQL backend can deadlock under concurrent publishes) leaves no thread
# publishing into the next row's rounds.
def threaded(n)
  threads = Array.new(THREADS) do |t|
    Thread.new { (n / THREADS + ((t < n % THREADS) ? 1 : 0)).times { yield } }.tap { |th| th.report_on_exception = false }
  end
  errors = threads.filter_map do |th|
    th.join
    nil
  rescue => e
    e
  end
  raise errors.first if errors.any?
end

# The rows of one section, measured round-robin by Bench::Section (one round of every row, then the next).
def interleaved(section, rows, ops:)
  rows.each { |name, baseline, run| section.measure(name, ops: ops, baseline: baseline) { |n| run.call(n) } }
end

def compare(title, peer, herald, ops:, extra: {})
  1000.times do
    peer.publish(CHANNEL, DATA)
    herald.publish(CHANNEL, DATA)
    extra.each_value { |b| b.publish(CHANNEL, DATA) }
  end
  Bench.section("#{title}: publish", note: "`MessageBus#publish` vs `Herald::Bus#publish` of #{DATA.to_json} on #{CHANNEL}, one thread, same server; rows measured round-robin.") do |s|
    rows = [["message_bus #{title} publish", true, ->(n) { n.times { peer.publish(CHANNEL, DATA) } }],
      ["Herald #{title} publish", false, ->(n) { n.times { herald.publish(CHANNEL, DATA) } }]]
    extra.each { |name, b| rows << ["Herald #{title} publish (#{name})", false, ->(n) { n.times { b.publish(CHANNEL, DATA) } }] }
    interleaved(s, rows, ops: ops)
  end
  Bench.section("#{title}: publish, #{THREADS} threads", note: "The same publish from #{THREADS} threads at once (each thread does its share of the operations), one bus per library; Herald groups concurrent publishes into one script call. Rows measured round-robin.") do |s|
    rows = [["message_bus #{title} publish, #{THREADS} threads", true, ->(n) { threaded(n) { peer.publish(CHANNEL, DATA) } }],
      ["Herald #{title} publish, #{THREADS} threads", false, ->(n) { threaded(n) { herald.publish(CHANNEL, DATA) } }]]
    interleaved(s, rows, ops: ops)
  end
  peer_last = peer.last_id(CHANNEL) - 100
  Bench.section("#{title}: backlog(100) of a 1,000-message channel",
    note: "message_bus backend `backlog` (baseline; `MessageBus#backlog` also JSON-decodes data) vs `Herald::Bus#backlog` (data decoded lazily). Herald's default row is answered from the per-process backlog cache after the first read (dropped whenever the store's listener announces a change to the channel); the \"no backlog cache\" rows read the server every time. Rows measured round-robin.") do |s|
    rows = [["message_bus #{title} backend backlog", true, ->(n) { n.times { peer.backend_instance.backlog(CHANNEL, peer_last) } }],
      ["message_bus #{title} MessageBus#backlog", false, ->(n) { n.times { peer.backlog(CHANNEL, peer_last) } }]]
    {nil => herald}.merge(extra).each do |name, b|
      from = b.last_id(CHANNEL) - 100
      rows << ["Herald #{title} backlog#{" (#{name})" if name}", false, ->(n) { n.times { b.backlog(CHANNEL, from) } }]
    end
    interleaved(s, rows, ops: ops / 4)
  end
end

# A child process waits on its own store instance; the parent publishes with a pause between messages
# and stamps each with its wall-clock send time. Latency = child's wake-up time - send time.
def wakeup_latency(count:)
  r, w = IO.pipe
  pid = fork do
    r.close
    store = yield
    last = store.last_global_id
    w.puts "ready"
    w.flush
    seen = 0
    while seen < count
      last = store.wait(last, timeout: 2)
      woke = Process.clock_gettime(Process::CLOCK_REALTIME)
      w.puts "#{last} #{woke}"
      w.flush
      seen += 1 if last
    end
  ensure
    exit!(0)
  end
  w.close
  r.gets
  store = yield
  sent = {}
  count.times do
    sleep 0.003
    t = Process.clock_gettime(Process::CLOCK_REALTIME)
    gid = store.append("/latency", Herald::Codec::Json.encode(t), codec: Herald::Codec::Json).global_id
    sent[gid] = t
  end
  latencies = []
  deadline = Time.now + 10
  while sent.any? && Time.now < deadline && (line = r.gets)
    gid, woke = line.split
    gid = gid.to_i
    sent.keys.select { |k| k <= gid }.each { |k| latencies << (woke.to_f - sent.delete(k)) * 1000 }
  end
  Process.kill(:KILL, pid) rescue nil # standard:disable Style/RescueModifier
  Process.wait(pid)
  store.close
  latencies.sort
end

def percentile(sorted, p) = sorted[((sorted.size - 1) * p).round]

begin
  if PARTS.include?("redis")
    mb_redis = message_bus_redis(redis_url)
    herald_redis = Herald::Bus.new(store: Herald::Store::Redis.new(url: redis_url, namespace: "bench#{Process.pid}"))
    herald_redis_nocache = Herald::Bus.new(store: Herald::Store::Redis.new(url: redis_url, namespace: "benchnc#{Process.pid}", backlog_cache: false))
    herald_redis_ruby = Herald::Bus.new(store: Herald::Store::Redis.new(url: redis_url, namespace: "benchrb#{Process.pid}", driver: :ruby, backlog_cache: false))
    puts "Herald's Redis store uses the #{herald_redis.store.driver} driver (hiredis-client) unless the row says otherwise; message_bus uses the redis gem's default Ruby driver.", ""
    compare("Redis", mb_redis, herald_redis, ops: 4000, extra: {"no backlog cache" => herald_redis_nocache, "Ruby driver, no backlog cache" => herald_redis_ruby})
  end

  if PARTS.include?("postgres")
    mb_pg = message_bus_postgres(pg_url)
    herald_pg = Herald::Bus.new(store: Herald::Store::Postgres.new(url: pg_url, table: "bench#{Process.pid}"))
    herald_pg_nocache = Herald::Bus.new(store: Herald::Store::Postgres.new(url: pg_url, table: "benchnc#{Process.pid}", backlog_cache: false))
    compare("PostgreSQL", mb_pg, herald_pg, ops: 2000, extra: {"no backlog cache" => herald_pg_nocache})
  end

  count = [(300 * Bench::SCALE).to_i, 20].max if PARTS.include?("wakeup")
  wake_name = "wake#{Process.pid}" # the same in the parent and the child
  PARTS.include?("wakeup") && Dir.mktmpdir("herald-bench-wakeup") do |dir|
    stores = {
      "Redis" => -> { Herald::Store::Redis.new(url: redis_url, namespace: wake_name) },
      "PostgreSQL" => -> { Herald::Store::Postgres.new(url: pg_url, table: wake_name) },
      "Log" => -> { Herald::Store::Log.new(dir: dir, fsync: :interval) }
    }
    rows = stores.map do |name, build|
      lat = wakeup_latency(count: count, &build)
      [name, lat]
    end
    puts "### publish -> wakeup latency across two processes", ""
    puts "A child process blocks in `store.wait`; the parent appends #{count} messages 3 ms apart; latency is the child's wake-up time minus the send time (same clock). Target: p99 <= 5 ms.", ""
    puts "| store | p50 | p99 | max | samples |", "|---|---:|---:|---:|---:|"
    rows.each do |name, lat|
      puts format("| %s | %.2f ms | %.2f ms | %.2f ms | %d |", name, percentile(lat, 0.5), percentile(lat, 0.99), lat.last, lat.size)
    end
    puts
  end
ensure
  [mb_redis, mb_pg].each { |b| b&.destroy }
  [herald_redis, herald_redis_nocache, herald_redis_ruby, herald_pg, herald_pg_nocache].each { |b| b&.close }
end
