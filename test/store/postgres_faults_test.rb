# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
require "logger"
require "stringio"
require "tempfile"
require "pg"

# PostgreSQL under the faults production meets (issue 14): a stalled backend, a lock held elsewhere,
# sessions ended by the server, publishers with different retention. Each test failed before its fix.
class PostgresFaultsTest < Minitest::Test
  def setup
    @url = Herald::TestServers.require!(self, :postgres)
    @table = "f_#{SecureRandom.hex(5)}"
    @stores = []
    @admin = PG.connect(@url)
    @admin.set_notice_processor { |_| }
  end

  def teardown
    @stopped&.each { |pid| Process.kill(:CONT, pid) rescue nil } # standard:disable Style/RescueModifier
    @stores.each { |s| s.close rescue nil } # standard:disable Style/RescueModifier
    @admin&.close
  end

  def store(**options)
    Herald::Store::Postgres.new(url: @url, table: @table, **options).tap { |s| @stores << s }
  end

  def append(store, channel, data, **options)
    store.append(channel, json_codec.encode(data), codec: json_codec, **options)
  end

  def backend_pids(store)
    pool = store.instance_variable_get(:@pool)
    pool.instance_variable_get(:@all).map(&:backend_pid)
  end

  # Returns once the sessions are gone (pg_terminate_backend only signals them).
  def terminate_herald_sessions
    sessions = "FROM pg_stat_activity WHERE application_name = 'herald'"
    @admin.exec("SELECT pg_terminate_backend(pid) #{sessions}")
    eventually { @admin.exec("SELECT count(*) #{sessions}").getvalue(0, 0) == "0" }
  end

  # Runs the block on a thread; fails (after letting the server go on) when it is not done in `within`.
  def finishes_within(within)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    thread = Thread.new { yield rescue $! } # standard:disable Style/RescueModifier
    done = thread.join(within)
    @stopped&.each { |pid| Process.kill(:CONT, pid) }
    flunk "still blocked after #{within}s" unless done
    [thread.value, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  # A reader that has not heard yet of the tables dropped and created again, reading after its cursor,
  # finds the new store's records whose ids (from 1 again) passed that cursor: the read tells it of the new
  # epoch, so its Bus starts the new store from its start instead of reading on without the first ones.
  def test_a_read_of_a_recreated_store_records_tells_the_new_epoch
    resets = []
    reader = store(on_reset: ->(old, new) { resets << [old, new] })
    10.times { |i| append(store, "/r", "old #{i} é") }
    assert_equal 10, reader.last_global_id
    epoch = reader.known_epoch
    @admin.exec("DROP TABLE #{@table}_meta, #{@table}_channels, #{@table}_messages")
    @admin.exec("DROP FUNCTION #{@table}_append(text, bytea, bigint, float8)")
    fresh = store # created after the reset: it creates the tables again
    13.times { |i| append(fresh, "/r", "new #{i} 🎉") }
    assert_equal ["new 10 🎉", "new 11 🎉", "new 12 🎉"], reader.global_backlog(10).map(&:data)
    refute_equal epoch, reader.known_epoch, "a read of the new store's records did not tell the reader of its epoch"
    assert_equal 1, resets.size
    assert_equal 13, reader.global_backlog(0).size
    assert_empty reader.global_backlog(13)
  end

  # (3) A backend that stops answering (SIGSTOP: a stalled server, a dead host) must not hang a publish.
  def test_a_publish_to_a_stalled_backend_raises_a_timeout_error_in_time
    s = store(pool: 1, timeout: 1)
    append(s, "/stall", 1)
    @stopped = backend_pids(s)
    @stopped.each { |pid| Process.kill(:STOP, pid) }
    error, took = finishes_within(4) { append(s, "/stall", 2) }
    assert_kind_of Herald::TimeoutError, error
    assert_kind_of Herald::ConnectionError, error
    assert_operator took, :<, 2.5
    assert_match(/timeout/, error.message)
    assert_equal 3, append(s, "/stall", 3).message_id, "the pool recovered with a new connection"
  end

  # (3) A lock held elsewhere: the server cancels the statement after `timeout`, so nothing is stored.
  def test_a_publish_behind_a_held_lock_is_cancelled_after_the_timeout
    s = store(timeout: 0.5)
    append(s, "/lock", 1)
    @admin.exec("BEGIN")
    @admin.exec("LOCK TABLE #{@table}_meta IN ACCESS EXCLUSIVE MODE")
    error, took = finishes_within(4) { append(s, "/lock", 2) }
    @admin.exec("ROLLBACK")
    assert_kind_of Herald::TimeoutError, error
    assert_operator took, :<, 1.5
    assert_equal 1, s.last_id("/lock"), "a cancelled publish is not stored"
    assert_equal 2, append(s, "/lock", 3).message_id
  end

  # (4) Pooled connections the server ended while idle (a restart, pg_terminate_backend) are found dead
  # at checkout: no publish fails once the server is back.
  def test_publishes_succeed_after_the_server_ended_every_idle_pooled_session
    s = store(pool: 5)
    5.times.map { Thread.new { s.send(:read) { |c| sleep(0.2) } } }.each(&:join)
    assert_equal 5, backend_pids(s).uniq.size
    terminate_herald_sessions
    results = 8.times.map { |i| append(s, "/after", i).message_id rescue $! } # standard:disable Style/RescueModifier
    assert_equal (1..8).to_a, results
  end

  # (10) libpq's FATAL notice on an ended session goes to Herald.logger, not straight to standard error.
  def test_libpq_notices_go_to_the_herald_logger
    log = StringIO.new
    Herald.logger = Logger.new(log)
    s = store
    append(s, "/n", 1)
    s.backlog("/n", 0) # starts the listener
    eventually { s.instance_variable_get(:@notifier).ready? }
    stderr = capture_fd_stderr do
      terminate_herald_sessions
      eventually { log.string.include?("terminating connection") }
      assert_equal [1], s.backlog("/n", 0).map(&:data) # reconnects
    end
    assert_match(/PostgreSQL: FATAL: +terminating connection/, log.string)
    assert_equal "", stderr
  ensure
    Herald.logger = nil
  end

  def capture_fd_stderr
    saved = $stderr.dup
    Tempfile.create("stderr") do |f|
      $stderr.reopen(f)
      yield
      $stderr.flush
      $stderr.reopen(saved)
      File.read(f.path)
    end
  ensure
    $stderr.reopen(saved)
  end

  # (9) Publishers with different max_backlog_size on one channel: each publish trims the channel to its
  # size, so the backlog holds what the last publisher asked for (as on Redis), not an overfilled mix.
  def test_mixed_sizes_on_one_channel_do_not_overfill_the_backlog
    big = store
    small = store
    300.times do |i|
      append(big, "/mixed", i)
      append(small, "/mixed", i, max_backlog_size: 10)
    end
    assert_equal (591..600).to_a, store.backlog("/mixed", 0).map(&:message_id)
    assert_equal (591..600).to_a, big.backlog("/mixed", 0).map(&:message_id)
    assert_equal 10, @admin.exec("SELECT count(*) FROM #{@table}_messages").getvalue(0, 0).to_i
  end

  # (8) Channel names have one documented maximum on every store; PostgreSQL's index rows cap what fits.
  def test_an_overlong_channel_name_is_an_invalid_message_on_every_store
    long = "/#{SecureRandom.hex(1_500)}" # 3,001 bytes that do not compress
    fit = "/#{SecureRandom.hex(Herald::Store::MAX_CHANNEL_BYTES / 2 - 1)}"
    stores = [Herald::Store::Memory.new, store, Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: @table)]
    stores.each do |st|
      bus = Herald::Bus.new(store: st)
      assert_raises(Herald::InvalidMessageError, st.class.name) { bus.publish(long, "x") }
      assert_raises(Herald::InvalidMessageError, st.class.name) { bus.publish("/a", "x", site_id: "s" * (Herald::Store::MAX_CHANNEL_BYTES + 1)) }
      assert_equal 1, bus.publish(fit, "x", site_id: "é" * (Herald::Store::MAX_CHANNEL_BYTES / 2)), st.class.name
      assert_equal ["x"], bus.backlog(fit, 0, site_id: "é" * (Herald::Store::MAX_CHANNEL_BYTES / 2)).map(&:data)
      bus.close
    end
  end
end
