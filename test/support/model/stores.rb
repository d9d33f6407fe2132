# frozen_string_literal: true

require "securerandom"
require "tmpdir"
require "fileutils"
require_relative "../servers"

module Herald
  module Model
    # The stores the model compares with Store::Memory (the oracle), by name (STORE=log_always).
    # A Subject builds one fresh, empty store of its kind, can open it again on the same data (a restart),
    # and removes what it left behind (directory, Redis keys, PostgreSQL tables).
    class Subject
      NAMES = %w[memory log_always log_interval log_never redis postgres].freeze

      attr_reader :name

      def self.available?(name)
        case name
        when "redis" then TestServers.redis_url
        when "postgres" then TestServers.postgres_url
        end
        true
      rescue TestServers::Unavailable
        false
      end

      # options: max_backlog_size and max_payload_bytes (the same for the oracle), segment_bytes (Log).
      def initialize(name, max_backlog_size:, segment_bytes:, max_payload_bytes: Store::Limits::MAX_PAYLOAD_BYTES)
        raise ArgumentError, "Unknown store #{name.inspect}, expected one of #{NAMES.inspect}" unless NAMES.include?(name)
        @name = name
        @size = max_backlog_size
        @segment_bytes = segment_bytes
        @max_payload_bytes = max_payload_bytes
        @dir = Dir.mktmpdir("herald-model") if log?
        @id = "m#{SecureRandom.hex(5)}"
      end

      def log? = @name.start_with?("log_")

      # Another process can share it (Memory lives in one process only).
      def forkable? = @name != "memory"

      def networked? = %w[redis postgres].include?(@name)

      def build
        case @name
        when "memory" then Store::Memory.new(max_backlog_size: @size, max_payload_bytes: @max_payload_bytes)
        when "redis"
          # The global set's own cap (max_global_backlog_size, 10,000 by default) is raised: the model compares
          # global backlogs, and Memory has no such cap. The cap is tested in test/store/redis_test.rb.
          Store::Redis.new(url: TestServers.redis_url, namespace: @id, max_backlog_size: @size,
            max_global_backlog_size: 10**9, on_reset: ->(*) {}, max_payload_bytes: @max_payload_bytes)
        when "postgres"
          Store::Postgres.new(url: TestServers.postgres_url, table: @id, max_backlog_size: @size, max_payload_bytes: @max_payload_bytes)
        else Store::Log.new(dir: @dir, fsync: @name.delete_prefix("log_").to_sym, segment_bytes: @segment_bytes,
          max_backlog_size: @size, max_payload_bytes: @max_payload_bytes)
        end
      end

      def cleanup
        FileUtils.rm_rf(@dir) if @dir
        case @name
        when "redis" then clean_redis
        when "postgres" then clean_postgres
        end
      rescue => e
        Herald.logger.warn "model: could not clean up #{@name} #{@id}: #{e.class}: #{e.message}"
      end

      private

      def clean_redis
        redis = RedisClient.new(url: TestServers.redis_url)
        cursor = "0"
        loop do
          cursor, keys = redis.call("SCAN", cursor, "MATCH", "#{@id}:*", "COUNT", 1000)
          redis.call("UNLINK", *keys) unless keys.empty?
          break if cursor == "0"
        end
      ensure
        redis&.close
      end

      def clean_postgres
        conn = PG.connect(TestServers.postgres_url)
        conn.set_notice_processor { |_| }
        %w[meta channels messages cursors].each { |t| conn.exec("DROP TABLE IF EXISTS #{@id}_#{t}") }
        conn.exec("DROP FUNCTION IF EXISTS #{@id}_append")
      ensure
        conn&.close
      end
    end
  end
end
