# frozen_string_literal: true

require "uri"

module MessageBus
  module Rack
    # message_bus's middleware: a Herald::Rack::Middleware over the bus's store with the bus's lookups and
    # settings. As with message_bus, they are read when requests come, not when the app is built: the Herald
    # middleware is built on the first request (apps and message_bus's specs configure the bus after `use`).
    class Middleware
      SETTINGS = %i[user_id_lookup group_ids_lookup site_id_lookup is_admin_lookup extra_response_headers_lookup
        on_middleware_error long_polling_enabled chunked_encoding_enabled max_active_clients base_route].freeze

      # The debug broadcast route's body, at most (refused over it, never cut).
      MAX_BROADCAST_BYTES = 4 * 1024 * 1024

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

      # Under `{base_route}message-bus/`: the debug broadcast route when allow_broadcast? is on, else the poll
      # between on_connect(site_id) and on_disconnect(site_id) (an app's hooks to pick and release the site's
      # database connection, as Discourse's multisite does). Everything else goes to the app untouched.
      def call(env)
        middleware = herald
        return middleware.call(env) unless env["PATH_INFO"].to_s.start_with?(middleware.prefix)
        return broadcast(env) if env["PATH_INFO"] == "#{middleware.prefix}broadcast" && @bus.allow_broadcast?
        around_request(env) { middleware.call(env) }
      end

      # The Herald middleware, built from the bus's settings on first use.
      def herald
        @herald || @lock.synchronize { @herald ||= Herald::Rack::Middleware.new(@app, bus: @bus.herald_bus, **options) }
      end

      # message_bus's middleware stops its subscription to the bus; Herald's holds none to stop.
      def stop_listener
      end

      private

      def around_request(env)
        on_connect = @bus.on_connect
        on_disconnect = @bus.on_disconnect
        return yield unless on_connect || on_disconnect
        site_id = @bus.site_id_lookup&.call(env)
        begin
          on_connect&.call(site_id)
          yield
        ensure
          on_disconnect&.call(site_id)
        end
      end

      # message_bus's `broadcast?channel=...&data=...`: publishes the string, answers "sent".
      def broadcast(env)
        input = env["rack.input"]
        input&.rewind if input.respond_to?(:rewind)
        body = input&.read(MAX_BROADCAST_BYTES + 1).to_s
        return [413, {"content-type" => "text/plain"}, ["too large"]] if body.bytesize > MAX_BROADCAST_BYTES
        form = "#{env["QUERY_STRING"]}&#{body}"
        params = URI.decode_www_form(form.delete_prefix("&").chomp("&"), Encoding::UTF_8).to_h
        @bus.publish(params["channel"], params["data"])
        [200, {"content-type" => "text/html"}, ["sent"]]
      end

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
