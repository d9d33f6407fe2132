# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
require_relative "../support/fault_run"
require "redis-client"
require "pg"

# The fault-injection suite (issue 14): publisher and subscriber processes on a real Redis and PostgreSQL of
# their own while the test kills, restarts (with and without persistence), stalls (SIGSTOP), flushes, fails
# over and locks the server. What users rely on, checked after each run (Herald::FaultRun counts them):
# every acknowledged publish readable once the server is back (where the server kept it; always for those
# acknowledged after the fault), a live subscriber gets every message once and in order or is told of a
# reset (on_reset), no call blocks past the documented bound, only Herald::Error reaches the caller, cached
# and uncached reads agree once settled.
#
# bin/test runs each fault once for FAULT_SECONDS (1.0) of traffic; bin/faults runs longer and repeats
# (FAULT_SECONDS=10 FAULT_ROUNDS=3 by default). A Markdown table of the figures is printed at exit.
class FaultsSuiteTest < Minitest::Test
  SECONDS = Float(ENV.fetch("FAULT_SECONDS", "1.0"))
  ROUNDS = Integer(ENV.fetch("FAULT_ROUNDS", "1"))
  REDIS_TIMEOUT = 1.0
  PG_TIMEOUT = 1.0
  # The longest a call may block: timeout + connect_timeout + the read retries' backoff (README), + 1.5 s
  # of slack for a loaded machine (the CI box runs the whole suite on 2 cores).
  REDIS_BOUND = REDIS_TIMEOUT + 1.0 + Herald::Store::Redis::RETRIES.sum + 1.5
  PG_BOUND = PG_TIMEOUT + Herald::Store::Postgres::CLIENT_MARGIN + 2.0 + Herald::Store::Postgres::RETRIES.sum + 1.5

  @results = []
  class << self
    attr_reader :results
  end

  Minitest.after_run do
    next if results.empty?
    puts "\n\n| store | fault | acked | failed | lost | lost after the fault | duplicated | skipped | told by on_reset | resets seen | longest publish | longest read |"
    puts "|---|---|---|---|---|---|---|---|---|---|---|---|"
    results.each do |r|
      puts "| #{r.store} | #{r.fault} | #{r.acked} | #{r.failed} | #{r.lost} | #{r.lost_after} | #{r.duplicated} | #{r.skipped} | " \
        "#{r.covered} | #{r.resets} | #{format("%.2f", r.longest_publish)} s | #{format("%.2f", r.longest_read)} s |"
    end
  end

  def run_fault(store, fault, build:, keeps_data:, bound:, &inject)
    ROUNDS.times do
      result = Herald::FaultRun.new(store: store, fault: fault, build: build, inject: inject, seconds: SECONDS).run
      self.class.results << result
      check(result, keeps_data: keeps_data, bound: bound)
    end
  end

  def check(r, keeps_data:, bound:)
    where = "#{r.store}, #{r.fault}"
    assert_operator r.acked, :>, 20, "#{where}: too little traffic to judge"
    assert_equal [], r.foreign, "#{where}: only Herald::Error may reach the caller"
    assert_equal 0, r.lost_after, "#{where}: publishes acknowledged after the fault were lost"
    assert_equal 0, r.lost, "#{where}: acknowledged publishes were lost" if keeps_data
    assert_equal 0, r.duplicated, "#{where}: a subscriber got a message twice"
    assert_equal 0, r.out_of_order, "#{where}: a subscriber got ids out of order"
    assert_equal 0, r.skipped, "#{where}: a subscriber missed messages and was not told of a reset"
    assert_equal 0, r.disagree, "#{where}: cached and uncached backlogs differ once settled"
    assert_operator [r.longest_publish, r.longest_read].max, :<=, bound, "#{where}: a call blocked too long"
  end

  # --- Redis -------------------------------------------------------------------------------------------

  def redis(*extra)
    @server = Herald::TestServers.redis_server(*extra)
    namespace = "fs#{SecureRandom.hex(4)}"
    url = @server[:url]
    ->(**o) { Herald::Store::Redis.new(url: url, namespace: namespace, timeout: REDIS_TIMEOUT, max_backlog_size: 100_000, max_global_backlog_size: 100_000, **o) }
  rescue Herald::TestServers::Unavailable => e
    ENV["CI"] ? flunk(e.message) : skip(e.message)
  end

  def redis_call(*command) = RedisClient.new(url: @server[:url], read_timeout: 10).then { |r| r.call(*command).tap { r.close } }

  def test_redis_restart_without_persistence
    build = redis
    run_fault("Redis", "kill -9 + restart, no persistence", build: build, keeps_data: false, bound: REDIS_BOUND) do
      Herald::TestServers.restart_redis_server!(@server)
    end
  end

  def test_redis_restart_with_aof_always
    build = redis("--appendonly", "yes", "--appendfsync", "always")
    run_fault("Redis", "kill -9 + restart, AOF always", build: build, keeps_data: true, bound: REDIS_BOUND) do
      Herald::TestServers.restart_redis_server!(@server)
    end
  end

  def test_redis_stalled
    build = redis
    run_fault("Redis", "SIGSTOP 1.5 s", build: build, keeps_data: true, bound: REDIS_BOUND) do
      Process.kill(:STOP, @server[:pid])
      sleep 1.5
    ensure
      Process.kill(:CONT, @server[:pid])
    end
  end

  def test_redis_flushall
    build = redis
    run_fault("Redis", "FLUSHALL", build: build, keeps_data: false, bound: REDIS_BOUND) { redis_call("FLUSHALL") }
  end

  def test_redis_clients_killed
    build = redis
    run_fault("Redis", "CLIENT KILL (all connections)", build: build, keeps_data: true, bound: REDIS_BOUND) do
      redis_call("CLIENT", "KILL", "TYPE", "normal")
      redis_call("CLIENT", "KILL", "TYPE", "pubsub")
    end
  end

  # A failover to a replica that missed the last writes: the replica stops replicating, the primary takes
  # writes it will not have, then becomes the replica's replica (READONLY, a full resync) and is promoted
  # back with the replica's data: ids below what clients saw, the same epoch.
  def test_redis_failover_to_a_stale_replica
    build = redis
    replica = Herald::TestServers.redis_server("--replicaof", "127.0.0.1", @server[:port].to_s)
    run_fault("Redis", "failover to a stale replica", build: build, keeps_data: false, bound: REDIS_BOUND) do
      stale = RedisClient.new(url: replica[:url])
      stale.call("REPLICAOF", "NO", "ONE")
      sleep 0.3
      redis_call("REPLICAOF", "127.0.0.1", replica[:port].to_s)
      sleep 0.05 until redis_call("INFO", "replication").include?("master_link_status:up")
      redis_call("REPLICAOF", "NO", "ONE")
    ensure
      stale&.close
    end
  end

  # --- PostgreSQL --------------------------------------------------------------------------------------

  def postgres
    @pg = self.class.pg_server
    table = "fs_#{SecureRandom.hex(4)}"
    url = @pg[:url]
    ->(**o) { Herald::Store::Postgres.new(url: url, table: table, timeout: PG_TIMEOUT, max_backlog_size: 100_000, **o) }
  rescue Herald::TestServers::Unavailable => e
    ENV["CI"] ? flunk(e.message) : skip(e.message)
  end

  def self.pg_server = @pg_server ||= Herald::TestServers.postgres_server

  def pg_admin
    conn = PG.connect(@pg[:url])
    conn.set_notice_processor { |_| }
    yield conn
  ensure
    conn&.close
  end

  def herald_backends(admin) = admin.exec("SELECT pid FROM pg_stat_activity WHERE application_name = 'herald'").column_values(0).map(&:to_i)

  def test_postgres_crash_and_restart
    build = postgres
    run_fault("PostgreSQL", "crash (stop -m immediate) + restart", build: build, keeps_data: true, bound: PG_BOUND) do
      Herald::TestServers.crash_postgres_server!(@pg)
    end
  end

  def test_postgres_sessions_terminated
    build = postgres
    run_fault("PostgreSQL", "pg_terminate_backend (all sessions)", build: build, keeps_data: true, bound: PG_BOUND) do
      pg_admin { |a| a.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'herald'") }
    end
  end

  def test_postgres_backends_stalled
    build = postgres
    run_fault("PostgreSQL", "SIGSTOP of every backend 1.5 s", build: build, keeps_data: true, bound: PG_BOUND) do
      pids = pg_admin { |a| herald_backends(a) }
      pids.each { |pid| Process.kill(:STOP, pid) }
      sleep 1.5
    ensure
      pids&.each { |pid| Process.kill(:CONT, pid) rescue nil } # standard:disable Style/RescueModifier
    end
  end

  def test_postgres_table_locked
    build = postgres
    table = build.call.tap(&:close).table
    run_fault("PostgreSQL", "LOCK TABLE meta 1.5 s", build: build, keeps_data: true, bound: PG_BOUND) do
      pg_admin do |a|
        a.transaction do
          a.exec("LOCK TABLE #{table}_meta IN ACCESS EXCLUSIVE MODE")
          sleep 1.5
        end
      end
    end
  end
end
