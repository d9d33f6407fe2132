# frozen_string_literal: true

module MessageBus
  # What `configure(backend:)` names, mapped to Herald's stores. Nothing configured: Herald's own default bus
  # (Herald.configure, $HERALD_STORE, else the embedded log; the Railtie's store under Rails), which
  # message_bus cannot offer.
  module Backend
    BACKENDS = {
      memory: ->(_config) { Herald::Store::Memory.new },
      redis: ->(config) { Herald::Store::Redis.new(**config.slice(:url).compact) },
      postgres: ->(config) { Herald::Store::Postgres.new(**postgres_url(config)) },
      log: ->(config) { Herald::Store::Log.new(dir: config[:dir] || Herald::Store::Log.default_dir) }
    }.freeze

    def self.store_for(config)
      name = config[:backend].to_sym
      factory = BACKENDS.fetch(name) { raise Herald::ConfigurationError, "Unknown backend #{name.inspect}, expected one of #{BACKENDS.keys.inspect}" }
      factory.call(config)
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
