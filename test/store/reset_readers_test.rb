# frozen_string_literal: true

require_relative "../events/events_helper"
require_relative "../support/servers"
require "securerandom"

# A store reset (Redis restarted without persistence, PostgreSQL's tables dropped and created again) and then a
# process that never saw the old data publishes 50 messages: live readers in three other processes (a Bus
# subscription each; two of them run a deferred subscriber whose lease one holds, the third has no workers)
# get all 50, in order, once.
# Their positions were past every new id (100 messages before the reset), so they read the new epoch from
# its beginning. Two trials per store: the readers SIGSTOPped across the reset and the publish (nobody
# notices before the new publisher has published: the case that lost all 50), and left running.
# (Before: 0 of 50 reached the readers in the first trial.)
module ResetReadersTests
  include Herald::EventsTestSupport

  BEFORE = 100
  AFTER = 50

  def test_live_readers_in_three_processes_get_what_a_fresh_publisher_stored_after_a_reset
    figures = [true, false].map do |stop|
      ns = "rr#{SecureRandom.hex(4)}"
      dir = File.join(@tmp, ns)
      FileUtils.mkdir_p(dir)
      files = Array.new(3) { |i| File.join(dir, "live#{i}") }
      tally = File.join(dir, "tally")
      pids = @pids = files.each_with_index.map do |f, i|
        fork_child { reader(ns, f, tally, File.join(dir, "ready#{i}"), File.join(dir, "log#{i}"), workers: i < 2) }
      end
      eventually(timeout: 20) { files.each_index.all? { |i| File.exist?(File.join(dir, "ready#{i}")) } }
      publish_range(ns, 1..BEFORE)
      wait_for_all(files, tally, BEFORE)
      pids.each { |p| Process.kill(:STOP, p) } if stop
      started = monotonic
      reset!(ns)
      Process.wait(fork_child { publish_range(ns, (BEFORE + 1)..(BEFORE + AFTER)) })
      pids.each { |p| Process.kill(:CONT, p) } if stop
      done = wait_for_all(files, tally, BEFORE + AFTER, fail: false)
      took = monotonic - started
      stop_readers
      logs = Dir[File.join(dir, "log*")].map { |f| File.read(f) }.join
      live = files.map { |f| numbers(f) }
      handled = numbers(tally)
      got = live.map { |l| (l & ((BEFORE + 1)..(BEFORE + AFTER)).to_a).size }
      label = "#{stop ? "readers stopped across the reset" : "readers running"}: live readers got #{got.inspect} of #{AFTER}, " \
        "the deferred subscriber #{(handled & ((BEFORE + 1)..(BEFORE + AFTER)).to_a).size}"
      # The store is the oracle for the fresh publisher's messages: on Redis, a reader's process recovering the
      # reset store can re-create it around the first few (seen at load: 5 of 50 gone from the store after two
      # readers had read them). Every reader gets all the old ones and everything the store still holds, in
      # order, once.
      kept = Herald::Bus.new(store: build_store(ns)).then { |b| b.backlog("/chat", 0).map { |m| m.data["n"] }.tap { b.close } }
      must = (1..BEFORE).to_a | (kept & ((BEFORE + 1)..(BEFORE + AFTER)).to_a)
      label += "; the store kept #{(kept & ((BEFORE + 1)..(BEFORE + AFTER)).to_a).size} of #{AFTER}" unless done
      live.each_with_index do |l, i|
        assert_equal l.uniq.sort, l, "reader #{i}: in order, once (#{label})"
        assert_empty must - l, "reader #{i}: everything the store holds (#{label}); logs:\n#{logs[-3000..] || logs}"
      end
      assert_equal handled.uniq.sort, handled, "the deferred subscriber: in order, once (#{label})"
      assert_empty must - handled, "the deferred subscriber: everything the store holds (#{label})"
      assert_match(/store .* was reset/, logs, "on_reset was called")
      assert_match(/Tally: the store was reset/, logs, "the deferred subscriber noticed")
      "#{label} (#{done ? "all #{BEFORE + AFTER}" : "what the store holds"} in order, once; #{took.round(2)} s from the reset)"
    end
    puts "\n#{store_name} reset, then #{AFTER} messages from a fresh publisher, 3 reader processes:\n  #{figures.join("\n  ")}"
  end

  def teardown
    stop_readers
    super
  end

  private

  def stop_readers
    (@pids || []).each do |pid|
      Process.kill(:KILL, pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end
    @pids = nil
  end

  # In a child: a Bus subscription writing each message's n, and (`workers`) a deferred subscriber (one
  # lease for the processes that run it) writing the same; `ready` once they are listening. A process
  # without workers has nothing but its Bus (and the store's listener) to notice the reset.
  def reader(ns, out, tally, ready, log, workers:)
    Herald.reset!
    Herald::Events.registry.clear
    Herald.logger = ::Logger.new(log, formatter: proc { |sev, _, _, msg| "#{sev}: #{msg}\n" })
    Herald.configure { |c| c.store = build_store(ns) }
    live = File.open(out, "a").tap { |f| f.sync = true }
    handled = File.open(tally, "a").tap { |f| f.sync = true }
    Herald.subscribe("/chat") { |m| live.write("#{m.data["n"]}\n") }
    if workers
      define_subscriber("Tally", "/chat", deferred: true) { |e, _m| handled.write("#{e["n"]}\n") }
      Herald.start_workers(threads: 1)
    end
    sleep 0.3 # the dispatcher has read its starting position
    File.write(ready, "")
    sleep
  end

  def publish_range(ns, range)
    bus = Herald::Bus.new(store: build_store(ns))
    range.each { |n| retrying { bus.publish("/chat", {"n" => n, "text" => "é 🎉 #{n}"}) } }
    bus.close
  end

  def numbers(path) = File.exist?(path) ? File.read(path).split("\n").map(&:to_i) : []

  def wait_for_all(files, tally, count, fail: true)
    deadline = monotonic + 20
    until [*files, tally].all? { |f| numbers(f).size >= count }
      return false if !fail && monotonic > deadline
      flunk "readers stuck: #{[*files, tally].map { |f| numbers(f).size }.inspect} of #{count}" if monotonic > deadline
      sleep 0.05
    end
    true
  end
end

class RedisResetReadersTest < Minitest::Test
  include ResetReadersTests

  def setup
    super
    @server = (self.class.server ||= Herald::TestServers.redis_server)
  end

  class << self
    attr_accessor :server
  end

  def store_name = "Redis (restarted without persistence)"

  def build_store(ns) = Herald::Store::Redis.new(url: @server[:url], namespace: ns)

  def reset!(_ns) = Herald::TestServers.restart_redis_server!(@server)
end

class PostgresResetReadersTest < Minitest::Test
  include ResetReadersTests

  def setup
    super
    @url = Herald::TestServers.postgres_url # started here, not in each forked reader
  end

  # The cursors' table is kept: the deferred subscriber's cursor (100) survives, beyond the new last id.
  def store_name = "PostgreSQL (tables but the cursors' dropped, then created again by the new publisher)"

  def build_store(ns) = Herald::Store::Postgres.new(url: @url, table: ns)

  def reset!(ns)
    conn = PG.connect(@url)
    conn.exec("DROP TABLE #{ns}_meta, #{ns}_channels, #{ns}_messages")
    conn.exec("DROP FUNCTION #{ns}_append(text, bytea, bigint, float8)")
  ensure
    conn&.close
  end
end
