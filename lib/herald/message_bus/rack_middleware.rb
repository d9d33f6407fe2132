# frozen_string_literal: true

module MessageBus
  module Rack
    # message_bus's middleware: a Herald::Rack::Middleware over the bus's store with the bus's lookups and
    # settings. As with message_bus, they are read when requests come, not when the app is built: the Herald
    # middleware is built on the first request (apps and message_bus's specs configure the bus after `use`).
    class Middleware
      SETTINGS = %i[user_id_lookup group_ids_lookup site_id_lookup is_admin_lookup extra_response_headers_lookup
        on_middleware_error long_polling_enabled chunked_encoding_enabled max_active_clients base_route].freeze

      attr_reader :started_listener # message_bus's: whether it subscribed to the bus (Herald's never does)

      # message_bus's reply body: a JSON array of {global_id, message_id, channel, data}.
      def self.backlog_to_json(backlog)
        JSON.dump(backlog.map { |m| {global_id: m.global_id, message_id: m.message_id, channel: m.channel, data: m.data} })
      end

      def initialize(app, config = {})
        @app = app
        @bus = config[:message_bus] || MessageBus
        @started_listener = false
        @lock = Mutex.new
        @herald = nil
      end

      def call(env) = herald.call(env)

      # The Herald middleware, built from the bus's settings on first use.
      def herald
        @herald || @lock.synchronize { @herald ||= Herald::Rack::Middleware.new(@app, bus: @bus.herald_bus, **options) }
      end

      # message_bus's middleware stops its subscription to the bus; Herald's holds none to stop.
      def stop_listener
      end

      private

      def options
        config = @bus.config
        options = SETTINGS.to_h { |name| [name, config[name]] }.compact
        options[:client_message_filters] = @bus.client_message_filters
        options[:long_polling_interval] = config[:long_polling_interval] / 1000.0 if config[:long_polling_interval]
        options
      end
    end
  end
end
