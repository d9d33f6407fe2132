# frozen_string_literal: true

begin
  require "pg"
rescue LoadError
  # An optional dependency: only apps that use this store need the gem, and they get told which one.
  raise LoadError, "Herald::Store::Postgres needs the pg gem: add `gem \"pg\"` to your Gemfile (or gem install pg)"
end
require_relative "postgres/schema"

module Herald
  module Store
    # Messages in PostgreSQL, shared by every process and host on the same database.
    #
    #   Herald::Store::Postgres.new(url: ENV["DATABASE_URL"], table: "herald", pool: 5,
    #     max_backlog_size: 1000, max_backlog_age: 7 * 86400, migrate: true)
    #
    # A publish is one call of a PL/pgSQL function (Schema); a backlog is one prepared SELECT whose rows
    # come back in binary as raw records (Store::Packed). Wakeups use LISTEN/NOTIFY on a dedicated
    # connection. Leases are session advisory locks: a process that dies frees them with its connection.
    # Reads are retried with backoff after a lost connection (readers keep their place: no loss, no
    # duplicate); a publish is not retried, since it may have committed: the caller decides. Pooled
    # connections the server ended while they sat idle are dropped at checkout, so a restart costs no call.
    #
    # `timeout:` (seconds, default 5) bounds every statement: the server cancels it (statement_timeout: a
    # lock held elsewhere) and the client stops waiting a moment later (a stalled server, a dead host),
    # raising Herald::TimeoutError. libpq's notices (a FATAL when a session is ended) go to Herald.logger.
    class Postgres
      include Networked
      include Controls

      DEFAULT_URL = "postgres://localhost/herald"
      DEFAULT_POOL = 5
      DEFAULT_TIMEOUT = 5
      MIGRATE_TIMEOUT = 60 # seconds
      CLIENT_MARGIN = 0.5 # seconds past statement_timeout before the client gives up on a silent server
      RETRIES = [0.05, 0.2, 0.5, 1.0].freeze
      # How often the listener checks the epoch while no wakeup comes (as Redis::CHECK_EVERY): tables
      # dropped and created again are noticed within this many seconds even when nobody publishes.
      CHECK_EVERY = 1.0
      LOST = [PG::ConnectionBad, PG::UnableToSend, PG::AdminShutdown].freeze
      STATEMENTS = {
        "append" => "SELECT g, m FROM %<t>s_append($1, $2, $3, $4)",
        # Newest first, at most the channel's size (trimming is batched, as in Redis), put back in order.
        "backlog" => "SELECT record FROM %<t>s_messages WHERE key = $1 AND message_id > $2 ORDER BY message_id DESC LIMIT $3",
        # Expired rows are left out before the LIMIT: a page is never short while live messages follow.
        "global" => "SELECT m.epoch, r.record FROM %<t>s_meta m LEFT JOIN LATERAL (SELECT record FROM %<t>s_messages " \
          "WHERE global_id > $1 AND expires_at > $3 ORDER BY global_id LIMIT $2) r ON true WHERE m.id = 1",
        # Before a channel's size grows from $2: trim exactly to $2 (a batched trim leaves up to $2/16 more,
        # which the larger size would bring back).
        "grow" => "WITH c AS (SELECT last_id, trimmed FROM %<t>s_channels WHERE key = $1 FOR UPDATE), " \
          "t AS (UPDATE %<t>s_channels AS ch SET trimmed = c.last_id - $2 FROM c WHERE ch.key = $1 AND c.last_id - $2 > c.trimmed " \
          "RETURNING c.trimmed AS low, ch.trimmed AS high) " \
          "DELETE FROM %<t>s_messages WHERE key = $1 AND message_id > (SELECT low FROM t) AND message_id <= (SELECT high FROM t)",
        "last_id" => "SELECT last_id FROM %<t>s_channels WHERE key = $1",
        "last_ids" => "SELECT key, last_id FROM %<t>s_channels WHERE key = ANY($1::text[])",
        "meta" => "SELECT global_id, epoch FROM %<t>s_meta WHERE id = 1",
        "load_cursor" => "SELECT global_id FROM %<t>s_cursors WHERE name = $1",
        "save_cursor" => "INSERT INTO %<t>s_cursors VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET global_id = EXCLUDED.global_id"
      }.freeze

      attr_reader :url, :table, :max_payload_bytes

      def initialize(url: ENV.fetch("DATABASE_URL", DEFAULT_URL), table: "herald", pool: DEFAULT_POOL,
        max_backlog_size: DEFAULT_MAX_BACKLOG_SIZE, max_backlog_age: DEFAULT_MAX_BACKLOG_AGE, migrate: true,
        on_reset: nil, backlog_cache: true, connect_timeout: 2, timeout: DEFAULT_TIMEOUT, max_payload_bytes: Limits::MAX_PAYLOAD_BYTES)
        Limits.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidArgumentError)
        raise InvalidArgumentError, "table must be a lowercase SQL identifier, got #{table.inspect}" unless table.is_a?(String) && /\A[a-z_][a-z0-9_]{0,40}\z/.match?(table)
        Limits.validate_seconds!(:timeout, timeout)
        Limits.validate_seconds!(:connect_timeout, connect_timeout)
        # A record (Store::Packed) is one bytea parameter and value: PostgreSQL's end at 1 GB, well above
        # any record Limits lets through.
        @max_payload_bytes = Limits.validate_max_payload!(max_payload_bytes)
        @url = url
        @table = table
        @timeout = timeout
        @connect_options = {application_name: "herald", connect_timeout: connect_timeout,
                            options: "-c statement_timeout=#{(timeout * 1000).ceil}"}
        @migrate = migrate
        @on_reset = on_reset || ->(old, new) { Herald.logger.warn "PostgreSQL store #{table} was reset (epoch #{old} -> #{new})" }
        @statements = STATEMENTS.transform_values { |sql| format(sql, t: table) }
        @retention = Retention.new(max_backlog_size, max_backlog_age)
        @lease_conns = []
        @epoch = nil
        @closed = false
        @array_encoder = PG::TextEncoder::Array.new
        @pool = Pool.new(size: pool, timeout: 5, connect: -> { connect }, close: ->(c) { c.close },
          abandon: ->(c) { abandon(c) }, alive: ->(c) { alive?(c) },
          broken: ->(e, c) { e.is_a?(Herald::TimeoutError) || LOST.any? { |k| e.is_a?(k) } || c.status != PG::CONNECTION_OK })
        @cache = BacklogCache.new if backlog_cache
        @notifier = Notifier.new(listen: method(:listen), on_error: ->(e) {}, on_change: ->(key) { @cache&.invalidate(key) })
        @fork_hook = ForkTracker.after_fork { after_fork }
      end

      # Creates the tables and the append function (idempotent; concurrent callers wait on an advisory lock).
      def migrate!
        # Not bound by `timeout:`: a migration may wait for another process's (DDL locks, the advisory lock).
        conn = PG.connect(@url, **@connect_options, options: "-c statement_timeout=#{MIGRATE_TIMEOUT * 1000}")
        quiet(conn)
        conn.transaction do
          conn.exec("SELECT pg_advisory_xact_lock(hashtext('herald migrate #{@table}'))")
          # Checked again under the lock: a store that waited here while another migrated must not run the DDL
          # again. ALTER TABLE and CREATE INDEX lock the tables even when nothing changes, in the opposite
          # order to an append's: beside the other store's first appends that was a deadlock.
          conn.exec(Schema.sql(@table, notify_channel)) unless Schema.current?(conn, @table)
        end
        self
      ensure
        conn&.close
      end

      def append(channel, payload, codec:, created_at: nil, user_ids: nil, group_ids: nil, client_ids: nil,
        site_id: nil, max_backlog_size: nil, max_backlog_age: nil)
        Limits.validate_append!(channel, site_id, payload, @max_payload_bytes, created_at)
        Limits.validate_retention!(max_backlog_size, max_backlog_age) if max_backlog_size || max_backlog_age
        targets = Limits.pack_targets(user_ids, group_ids, client_ids) # before the retention is remembered
        raise ClosedError, "store is closed" if @closed
        key = key_for(channel, site_id)
        before = @retention.for(key).first
        size, age = @retention.for(key, max_backlog_size, max_backlog_age)
        created_at = created_at&.to_f || Process.clock_gettime(Process::CLOCK_REALTIME)
        tail = Packed.tail(channel, payload, codec, created_at, age, site_id, targets)
        row = write do |c|
          run(c, "grow", [key, before]) if before < size
          run(c, "append", [key, {value: tail, format: 1}, size, created_at + age]).values.first
        end
        gid = row[0].to_i
        @notifier.notify(gid, key)
        Herald::Message.build(gid, row[1].to_i, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
      end

      def last_id(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        first_value(read { |c| run(c, "last_id", [key_for(channel, site_id)]) }).to_i
      end

      def last_ids(channels, site_id: nil)
        Limits.validate_keys!(channels, site_id)
        keys = channels.map { |ch| key_for(ch, site_id) }
        found = read { |c| run(c, "last_ids", [@array_encoder.encode(keys)]).values }.to_h
        channels.zip(keys).to_h { |ch, key| [ch, found[key].to_i] }
      end

      def last_global_id
        gid, epoch = read { |c| run(c, "meta", []).values.first }
        saw(epoch, gid.to_i)
        gid.to_i
      end

      def backlog(channel, last_id = 0, site_id: nil)
        Limits.validate_key!(channel, site_id)
        Limits.validate_id!(:last_id, last_id)
        key = key_for(channel, site_id)
        size = @retention.for(key).first
        cached(key, last_id) do
          Packed.decode_all(read { |c| run(c, "backlog", [key, last_id, size], 1).column_values(0) }.reverse!, channel)
        end
      end

      def global_backlog(last_id = 0, limit: nil)
        Limits.validate_id!(:last_id, last_id)
        Limits.validate_limit!(limit)
        now = Process.clock_gettime(Process::CLOCK_REALTIME)
        rows = read { |c| run(c, "global", [last_id, limit, now], 1) }
        new_epoch!(rows.getvalue(0, 0)) if rows.ntuples > 0
        Packed.decode_all(rows.column_values(1).compact)
      end

      def epoch
        last_global_id
        @epoch
      end

      # Kept fresh by every append and read of the meta and by the listener's periodic check.
      def known_epoch = @epoch || epoch

      def load_cursor(name, default: 0)
        raw = first_value(read { |c| run(c, "load_cursor", [name]) })
        Store.parse_cursor(raw, name: name, where: "the table #{@table}_cursors", default: default)
      end

      def save_cursor(name, global_id)
        Store.validate_cursor!(global_id)
        write { |c| run(c, "save_cursor", [name, global_id]) }
      end

      # A session advisory lock on a connection of its own: held until released or the process dies.
      def lease(name)
        conn = connect
        key = "herald lease #{@table} #{name}"
        # The session names its process, so lease_holder can say who holds the lock.
        conn.exec_params("SELECT set_config('application_name', $1, false)", ["herald #{Store.lease_holder_id}"[0, 63]])
        unless conn.exec_params("SELECT pg_try_advisory_lock(hashtext($1))", [key]).getvalue(0, 0) == "t"
          conn.close
          return nil
        end
        @lease_conns << conn
        Lease.new do
          @lease_conns.delete(conn)
          conn.close unless conn.finished?
        end
      end

      def retention(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        @retention.for(key_for(channel, site_id)).dup
      end

      def stats
        size, age = @retention.for(nil)
        {"kind" => "postgresql", "server" => Store.redact_url(@url), "table" => @table,
         "max_backlog_size" => size, "max_backlog_age" => age}
      end

      # The advisory lock's holder as its session named itself ("host:pid"), nil when nobody holds it.
      def lease_holder(name)
        key = "herald lease #{@table} #{name}"
        result = read { |c| c.exec_params(LEASE_HOLDER, [key]) }
        first_value(result)&.delete_prefix("herald ")
      end

      LEASE_HOLDER = <<~SQL
        SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid
          AND l.objid = (hashtext($1)::bigint & 4294967295)::oid
        LIMIT 1
      SQL

      # Forget connections and threads inherited from the parent (runs by itself in a forked child).
      # The listener's and the leases' connections are the parent's too: abandoned, never closed (a close,
      # even by garbage collection, would end the parent's session and free its advisory locks).
      def after_fork
        @pool.after_fork
        [@listener_conn, *@lease_conns].compact.each { |c| abandon(c) }
        @listener_conn = nil
        @lease_conns = []
      end

      def close
        return if @closed
        @closed = true
        ForkTracker.remove(@fork_hook)
        @notifier.stop
        @pool.close
      end

      private

      # PostgreSQL text cannot hold NUL, which channel names and site ids may contain. Such a key (and
      # any key starting with the marker) is stored escaped behind the marker U+10FFFF: marker -> marker
      # marker, NUL -> marker "0". Other keys are stored as they are, so the mapping stays one-to-one.
      KEY_MARK = "\u{10FFFF}"
      KEY_ESCAPES = {KEY_MARK => KEY_MARK * 2, "\0" => "#{KEY_MARK}0"}.freeze

      def key_for(channel, site_id)
        key = Store.channel_key(channel, site_id)
        return key unless key.include?("\0") || key.start_with?(KEY_MARK)
        KEY_MARK + key.gsub(/[\u{10FFFF}\0]/, KEY_ESCAPES)
      end

      # libpq prints what the server says outside a query (a FATAL when a session is ended) to standard
      # error: send it to Herald.logger instead. Lost connections surface as errors anyway.
      def quiet(conn)
        conn.set_notice_processor { |message| Herald.logger.info("PostgreSQL: #{message.strip}") }
        conn.exec("SET client_min_messages TO warning")
      end

      # One prepared statement, waiting at most `timeout` (+ a margin for the server's own cancel) for the
      # whole exchange; a connection left mid-exchange is discarded by the pool (broken).
      def run(conn, name, params, result_format = 0)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout + CLIENT_MARGIN
        conn.send_query_prepared(name, params, result_format)
        until conn.flush
          conn.socket_io.wait_writable(time_left(deadline)) or timed_out!
        end
        conn.block(time_left(deadline)) or timed_out!
        conn.get_last_result
      end

      def time_left(deadline) = [deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC), 0].max

      def timed_out!
        raise Herald::TimeoutError, "PostgreSQL at #{@url} did not answer within #{@timeout}s (the store's timeout:)"
      end

      # Nothing arrives on an idle pooled connection but the server's goodbye (a FATAL, then EOF): anything
      # readable means the session is ending, even while its close is still a moment behind the message.
      # (Reading it hands the FATAL to the notice processor, i.e. to Herald.logger.)
      def alive?(conn)
        return false if conn.finished? || conn.status != PG::CONNECTION_OK
        return true unless conn.socket_io.wait_readable(0)
        conn.check_socket
        false
      rescue PG::Error, IOError, SystemCallError
        false
      end

      def first_value(result) = (result.ntuples > 0) ? result.getvalue(0, 0) : nil

      def notify_channel = "#{@table}_wake"

      def connect
        conn = PG.connect(@url, **@connect_options)
        quiet(conn)
        ensure_schema(conn)
        @statements.each { |name, sql| conn.prepare(name, sql) }
        conn.setnonblocking(true) # `run` flushes and waits itself, with a deadline
        conn
      rescue PG::ConnectionBad => e
        raise ConnectionError, "PostgreSQL at #{@url} is unreachable: #{e.message.strip}"
      end

      def ensure_schema(conn)
        return if @schema_ready || !@migrate
        migrate! unless conn.exec("SELECT to_regprocedure('#{@table}_append(text,bytea,bigint,float8)')").getvalue(0, 0)
        @schema_ready = true
      end

      # A connection made before a fork: point its socket at /dev/null so nothing (not even the close
      # that garbage collection does) talks to the parent's server session.
      def abandon(conn)
        conn.socket_io.reopen(IO::NULL)
      rescue
        nil
      end

      def retry_read?(error) = LOST.any? { |k| error.is_a?(k) } || error.instance_of?(ConnectionError)

      # A publish may have committed before a connection died; one that could not connect (`connect` raises
      # ConnectionError: a restart under way) sent nothing.
      def retry_write?(error) = error.instance_of?(ConnectionError)

      def herald_error(error)
        message = error.message.strip
        case error
        when Herald::Error then error
        when *LOST then ConnectionError.new("lost the connection to PostgreSQL at #{@url}: #{message}")
        when PG::QueryCanceled then TimeoutError.new("PostgreSQL at #{@url} cancelled a statement after the store's timeout: (#{@timeout}s): #{message}")
        when PG::ReadOnlySqlTransaction then ReadOnlyError.new("PostgreSQL at #{@url} is read-only (#{message}): point the store at the primary")
        when PG::Error then StoreError.new("PostgreSQL at #{@url} refused the statement: #{message}")
        else error
        end
      end

      # The epoch read with the records: a reader whose listener has not noticed the tables dropped and created
      # again must not read the new store's records as a continuation of the old one's (ids start from 1
      # again: those above its cursor would come without the first ones). The meta tells the new last id.
      def new_epoch!(epoch)
        last_global_id if @epoch && epoch != @epoch
      end

      # A new epoch: the tables were dropped and created again (ids restart from 1). Cached backlogs go, and
      # waiters on the old ids are told the new last id (Notifier#reset).
      def saw(epoch, gid)
        return if epoch.nil? || epoch == @epoch
        old = @epoch
        @epoch = epoch
        return unless old
        @cache&.clear
        @notifier.reset(gid)
        @on_reset.call(old, epoch)
      end

      # The notifier's listener: LISTEN on a dedicated connection, blocking in wait_for_notify.
      def listen(notifier)
        conn = @listener_conn = PG.connect(@url, **@connect_options)
        quiet(conn)
        conn.exec("LISTEN #{notify_channel}")
        notifier.ready(heard = last_global_id)
        until @closed
          woken = conn.wait_for_notify(CHECK_EVERY) do |_channel, _pid, payload|
            gid, key = payload.split(",", 2)
            gid = gid.to_i
            last_global_id if gid <= heard # ids went back: tables dropped and created again? (the epoch says)
            heard = gid
            notifier.notify(gid, key)
          end
          heard = last_global_id unless woken # quiet: were the tables replaced meanwhile?
          raise PG::ConnectionBad, "listener connection lost" if conn.status != PG::CONNECTION_OK
        end
      ensure
        conn&.close
      end
    end
  end
end
