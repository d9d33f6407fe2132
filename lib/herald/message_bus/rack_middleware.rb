# frozen_string_literal: true

module MessageBus
  module Rack
    # message_bus's middleware, as Herald::Rack::Middleware over the bus's store, with the bus's lookups
    # and settings (read when the middleware is built: configure the bus first, as with message_bus).
    class Middleware < Herald::Rack::Middleware
      SETTINGS = %i[user_id_lookup group_ids_lookup site_id_lookup is_admin_lookup extra_response_headers_lookup
        on_middleware_error long_polling_enabled chunked_encoding_enabled max_active_clients base_route].freeze

      def initialize(app, config = {})
        bus = config[:message_bus] || MessageBus
        options = SETTINGS.to_h { |name| [name, bus.config[name]] }.compact
        options[:client_message_filters] = bus.client_message_filters
        options[:long_polling_interval] = bus.config[:long_polling_interval] / 1000.0 if bus.config[:long_polling_interval]
        super(app, bus: bus.herald_bus, **options)
      end
    end
  end
end
