# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
require_relative "contract"
require_relative "networked_contract"
require "herald/cli"

class PostgresStoreTest < Minitest::Test
  include StoreContract
  include NetworkedStoreContract

  def setup
    Herald::TestServers.require!(self, :postgres)
    super
  end

  def build_store(**options)
    Herald::Store::Postgres.new(url: url, table: "t_#{SecureRandom.hex(5)}", **options)
  end

  def twin_store(store, **options)
    Herald::Store::Postgres.new(url: url, table: store.table, **options).tap { |s| @stores << s }
  end

  def url = Herald::TestServers.postgres_url

  # Kills every Herald session (pool, listener) server-side, as a failover or a DBA would.
  def disrupt!
    admin = PG.connect(url)
    admin.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'herald' AND pid <> pg_backend_pid()")
  ensure
    admin&.close
  end

  def test_reader_survives_killed_connections_without_loss_or_duplicate
    assert_reader_survives_disruption(expect_reset: false)
  end

  # Slow transactions from several sessions (a fault the PostgreSQL store must survive): a poller reading "global_id > last" must
  # never skip an id that commits after a higher one (what a bigserial would do).
  def test_ids_follow_commit_order_with_slow_concurrent_transactions
    last = append("/warm", 0).global_id
    seen = []
    writers = 4.times.map do |t|
      Thread.new do
        conn = PG.connect(url)
        5.times do |i|
          tail = Herald::Store::Packed.tail("/slow", json_codec.encode([t, i]), json_codec, Time.now.to_f, 60, nil, Herald::Store::Limits::EMPTY)
          conn.transaction do
            conn.exec_params("SELECT * FROM #{@store.table}_append('/slow', $1, 1000, $2)", [{value: tail, format: 1}, Time.now.to_f + 60])
            conn.exec("SELECT pg_sleep(random() * 0.02)")
          end
        end
      ensure
        conn&.close
      end
    end
    Timeout.timeout(20) do
      while seen.size < 20
        @store.global_backlog(last).each { |m| seen << (last = m.global_id) }
        sleep 0.001
      end
    end
    writers.each(&:join)
    assert_equal @store.global_backlog(0).map(&:global_id).drop(1), seen, "a poller never skips a late commit"
  end

  # Garbage collection in a forked child must not close the parent's sessions (its lease, its listener).
  def test_a_forked_child_leaves_the_parents_sessions_alone
    lease = @store.lease("fork-lease")
    assert lease
    append("/fork", 1)
    @store.wait(@store.last_global_id, timeout: 0.05) # the listener is connected
    pid = in_child do
      assert_equal [1], @store.backlog("/fork", 0).map(&:data)
      # What garbage collection does to every inherited connection object the child drops:
      ObjectSpace.each_object(PG::Connection) { |c| c.finish unless c.finished? }
    end
    Process.wait(pid)
    assert_predicate $?, :success?
    assert_nil twin_store(@store).lease("fork-lease"), "the parent's advisory lock was freed by the child"
    append("/fork", 2)
    assert_equal [1, 2], @store.backlog("/fork", 0).map(&:data)
    lease.release
  end

  def test_migrate_command_creates_the_schema
    table = "m_#{SecureRandom.hex(4)}"
    out = StringIO.new
    assert_equal 0, Herald::CLI.run(["migrate", "--url", url, "--table", table], out: out, err: out)
    assert_match(/#{table}/, out.string)
    s = Herald::Store::Postgres.new(url: url, table: table, migrate: false)
    assert_equal 1, s.append("/m", json_codec.encode(1), codec: json_codec).message_id
  ensure
    s&.close
  end

  # A store that waited on the migration lock while another migrated (two processes starting on a new table),
  # or `herald migrate` run while the app publishes, finds the schema current and takes no table lock. It
  # ran the DDL again: ALTER TABLE waited behind any open append (queueing every later one behind it), and
  # beside a store's first appends the two lock orders deadlocked ("deadlock detected" in CI).
  def test_migrating_a_current_schema_takes_no_table_lock
    append("/m", "first")
    appender = PG.connect(url)
    tail = Herald::Store::Packed.tail("/m", json_codec.encode("open"), json_codec, Time.now.to_f, 60, nil, Herald::Store::Limits::EMPTY)
    appender.exec("BEGIN")
    appender.exec_params("SELECT * FROM #{@store.table}_append('/m', $1, 1000, $2)", [{value: tail, format: 1}, Time.now.to_f + 60])
    twin = twin_store(@store)
    Timeout.timeout(5) { twin.migrate! }
    appender.exec("COMMIT")
    assert_equal %w[first open], twin.backlog("/m", 0).map { |m| m.data }
  ensure
    appender&.close
  end

  def test_store_from_url
    %w[postgres postgresql].each do |scheme|
      s = Herald::Store.from_url(url.sub(/\Apostgres/, scheme))
      assert_instance_of Herald::Store::Postgres, s
      s.close
    end
  end
end
