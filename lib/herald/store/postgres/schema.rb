# frozen_string_literal: true

module Herald
  module Store
    class Postgres
      # The tables and the append function, created by the store on first use or by `herald migrate`.
      # Every name starts with the store's `table` prefix, so several buses can share one database.
      #
      # Ids are assigned in COMMIT order: the append function increments one counter row, whose row lock
      # is held until the transaction commits, so a reader asking for "global_id > last" never sees a
      # later id commit before an earlier one (a bigserial would let a slow commit be skipped).
      module Schema
        VERSION = 4

        # The tables are at VERSION and the append function exists: nothing to do.
        def self.current?(conn, t)
          return false unless conn.exec("SELECT to_regprocedure('#{t}_append(text,bytea,bigint,float8)')").getvalue(0, 0)
          meta = conn.exec("SELECT version FROM #{t}_meta WHERE id = 1")
          meta.ntuples == 1 && meta.getvalue(0, 0).to_i >= VERSION
        end

        def self.sql(t, notify)
          <<~SQL
            CREATE TABLE IF NOT EXISTS #{t}_meta (id int PRIMARY KEY CHECK (id = 1), epoch text NOT NULL,
              global_id bigint NOT NULL, version int NOT NULL);
            INSERT INTO #{t}_meta VALUES (1, md5(random()::text || clock_timestamp()::text), 0, #{VERSION})
              ON CONFLICT (id) DO NOTHING;
            CREATE TABLE IF NOT EXISTS #{t}_channels (key text PRIMARY KEY, last_id bigint NOT NULL);
            -- v4: every message_id up to `trimmed` is deleted, so a trim deletes a bounded range.
            ALTER TABLE #{t}_channels ADD COLUMN IF NOT EXISTS trimmed bigint NOT NULL DEFAULT 0;
            CREATE TABLE IF NOT EXISTS #{t}_messages (global_id bigint PRIMARY KEY, key text NOT NULL,
              message_id bigint NOT NULL, expires_at float8 NOT NULL, record bytea NOT NULL);
            CREATE UNIQUE INDEX IF NOT EXISTS #{t}_messages_key ON #{t}_messages (key, message_id);
            CREATE TABLE IF NOT EXISTS #{t}_cursors (name text PRIMARY KEY, global_id bigint NOT NULL);
            UPDATE #{t}_meta SET version = #{VERSION} WHERE version < #{VERSION};
            DROP FUNCTION IF EXISTS #{t}_append(text, bytea, bigint, float8, boolean);
            -- One round trip per publish: ids, the record (ids prepended to the client's tail: Store::Packed),
            -- size trimming, an occasional age sweep, and the wakeup (delivered at commit).
            CREATE OR REPLACE FUNCTION #{t}_append(p_key text, p_tail bytea, p_max_size bigint, p_expires float8,
              OUT g bigint, OUT m bigint) LANGUAGE plpgsql AS $$
            DECLARE
              v_trimmed bigint;
            BEGIN
              UPDATE #{t}_meta SET global_id = global_id + 1 WHERE id = 1 RETURNING global_id INTO g;
              INSERT INTO #{t}_channels AS c (key, last_id) VALUES (p_key, 1)
                ON CONFLICT (key) DO UPDATE SET last_id = c.last_id + 1 RETURNING c.last_id, c.trimmed INTO m, v_trimmed;
              INSERT INTO #{t}_messages VALUES (g, p_key, m, p_expires,
                float8send(g::float8) || float8send(m::float8) || p_tail);
              -- Trims in batches (once `p_max_size / 16` past the size, as Redis does; readers LIMIT to the
              -- size), deleting the range above the last trim only: whatever the sizes other publishers
              -- give, nothing at or below m - p_max_size survives, and no dead index entry is walked twice.
              IF m - p_max_size > v_trimmed + p_max_size / 16 THEN
                DELETE FROM #{t}_messages WHERE key = p_key AND message_id > v_trimmed AND message_id <= m - p_max_size;
                UPDATE #{t}_channels SET trimmed = m - p_max_size WHERE key = p_key;
              END IF;
              IF random() < 0.001 THEN
                DELETE FROM #{t}_messages WHERE global_id IN (SELECT global_id FROM #{t}_messages
                  WHERE expires_at < extract(epoch FROM clock_timestamp()) LIMIT 1000);
              END IF;
              -- The channel key lets every process drop its cached backlog of that channel (NOTIFY payloads are
              -- limited to 8000 bytes: a longer key sends the id alone, which drops every cached channel).
              PERFORM pg_notify('#{notify}', CASE WHEN octet_length(p_key) < 7900 THEN g::text || ',' || p_key ELSE g::text END);
            END $$;
          SQL
        end
      end
    end
  end
end
