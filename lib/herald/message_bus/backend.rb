# frozen_string_literal: true

require "fileutils"

module MessageBus
  # What `configure(backend:)` names, mapped to Herald's stores. Nothing configured: Herald's own default bus
  # (Herald.configure, $HERALD_STORE, else the embedded log; the Railtie's store under Rails), which
  # message_bus cannot offer.
  module Backend
    BACKENDS = {
      memory: ->(_config) { Herald::Store::Memory.new },
      redis: ->(config) { Herald::Store::Redis.new(**redis_url(config)) },
      postgres: ->(config) { Herald::Store::Postgres.new(**postgres_url(config)) },
      log: ->(config) { Herald::Store::Log.new(dir: config[:dir] || Herald::Store::Log.default_dir) }
    }.freeze

    # What message_bus's reset! does to its backend: every message gone, ids from 1 again (its specs count on
    # it). Run on a closed store: the next store opened on the same place starts empty.
    WIPES = {
      memory: ->(_store) {},
      redis: ->(store) { wipe_redis(store) },
      postgres: ->(store) { wipe_postgres(store) },
      log: ->(store) { FileUtils.rm_rf(Dir.children(store.dir).map { |f| File.join(store.dir, f) }) }
    }.freeze

    def self.wipe(name, store) = WIPES.fetch(name.to_sym).call(store)

    def self.wipe_redis(store)
      redis = RedisClient.new(url: store.url)
      cursor = "0"
      loop do
        cursor, keys = redis.call("SCAN", cursor, "MATCH", "#{store.namespace}:*", "COUNT", 1000)
        redis.call("DEL", *keys) if keys.any?
        break if cursor == "0"
      end
    ensure
      redis&.close
    end

    # The rows, not the tables: other stores of this process may still have them prepared.
    def self.wipe_postgres(store)
      t = store.table
      conn = PG.connect(store.url)
      conn.exec("TRUNCATE #{t}_messages, #{t}_channels, #{t}_cursors")
      conn.exec("UPDATE #{t}_meta SET global_id = 0, epoch = md5(random()::text || clock_timestamp()::text)")
    ensure
      conn&.close
    end

    def self.store_for(config)
      name = config[:backend].to_sym
      factory = BACKENDS.fetch(name) { raise Herald::ConfigurationError, "Unknown backend #{name.inspect}, expected one of #{BACKENDS.keys.inspect}" }
      factory.call(config)
    end

    # message_bus 4.5 reads `redis_config: {url:}` (or host/port/db/password, as redis-rb does); `url:` and
    # $REDIS_URL as well.
    def self.redis_url(config)
      rc = config[:redis_config] || {}
      url = config[:url] || rc[:url]
      url ||= "redis://#{":#{rc[:password]}@" if rc[:password]}#{rc[:host] || "127.0.0.1"}:#{rc[:port] || 6379}/#{rc[:db] || 0}" if rc[:host] || rc[:port]
      url ? {url: url} : {}
    end

    # message_bus passes PostgreSQL's connection as backend_options (PG.connect's keywords).
    def self.postgres_url(config)
      return {url: config[:url]} if config[:url]
      opts = config[:backend_options]
      return {} unless opts
      require "pg"
      {url: PG::Connection.parse_connect_args(**opts.compact)}
    end

    # `bus.backend_instance`: what message_bus's own tests reach for.
    class Instance
      def initialize(bus)
        @bus = bus
      end

      # Forgets every message: a new, empty store of the same kind (subscriptions carry on).
      def reset! = @bus.send(:reset_store!)

      def store = @bus.herald_bus.store
    end
  end
end
