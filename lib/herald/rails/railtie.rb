# frozen_string_literal: true

require_relative "quiet_polls"
require_relative "helper"
require_relative "versions"

if defined?(::Rails::VERSION::STRING)
  require "json"
  Herald::Rails.check_versions!(rails: ::Rails::VERSION::STRING, json: JSON::VERSION)
end

module Herald
  # Rails integration, loaded by lib/herald.rb only when Rails is (::Rails::Railtie defined).
  module Rails
    # Middleware options config.herald may carry (user_id_lookup, group_ids_lookup, site_id_lookup, ...).
    MIDDLEWARE_KEYS = (Herald::Rack::Middleware::DEFAULTS.keys - [:on_error]).freeze

    # The store when nobody chose one: HERALD_STORE, config.herald.store, HERALD_DIR, else
    # storage/herald/<env> (each environment its own log and cursors), the memory store in tests.
    def self.default_store(app)
      [ENV["HERALD_STORE"], app.config.herald[:store], ENV["HERALD_DIR"]].find { |s| s.is_a?(Symbol) || !s.to_s.empty? } ||
        (::Rails.env.test? ? :memory : app.root.join("storage", "herald", ::Rails.env).to_s)
    end

    # Handlers run as Rails code does in a request: deferred ones in the reloader (new code after an edit in
    # development; connections returned to the pool), sync ones in the executor (a no-op inside a request).
    def self.handler_wrapper(app)
      ->(deferred:, &block) { (deferred ? app.reloader : app.executor).wrap(&block) }
    end

    # `app/subscribers` loaded at boot and after every reload (Zeitwerk loads nothing until it is named);
    # the registry is keyed by class name, so a reloaded subscriber replaces its old class.
    def self.load_subscribers(app)
      dir = app.root.join("app", "subscribers")
      ::Rails.autoloaders.main.eager_load_dir(dir.to_s) if dir.directory?
    end

    # Development: the workers' pool asks about every second, so a new file in app/subscribers is loaded
    # (and its deferred subscriber started) on the next reload, even when no request comes to reload first.
    def self.reload_check(app)
      reloading = app.config.respond_to?(:reloading_enabled?) ? app.config.reloading_enabled? : !app.config.cache_classes
      -> { app.reloader.wrap {} if app.reloader.check! } if reloading
    end

    def self.forget_unloaded(value)
      Events.registry.unregister(value) if value.is_a?(Class) && value.include?(Herald::Subscriber)
    end

    class Railtie < ::Rails::Railtie
      config.herald = ActiveSupport::OrderedOptions.new
      config.herald.middleware = true # false: mount Herald::Rack::Middleware yourself
      config.herald.quiet_polls = true # polls leave no line in the Rails log (their path holds the client id)
      config.herald.store = nil # a URL, a directory, :memory or a store object (see Herald::Rails.default_store)

      initializer "herald.logger" do
        Herald.logger = ::Rails.logger if ::Rails.logger
      end

      # What strict JSON refuses (a Time, a BigDecimal, a model, anything with as_json) is encoded as Rails
      # encodes JSON, so Herald.publish sends what ActionCable.server.broadcast would.
      initializer "herald.helper" do
        ActiveSupport.on_load(:action_view) { include Herald::Rails::Helper }
      end

      initializer "herald.json" do
        require "active_support/json"
        Herald::Codec::Json.fallback = ActiveSupport::JSON
      end

      # Nothing is opened here: the bus is built on first publish, poll or worker start.
      initializer "herald.store", after: :load_config_initializers do |app|
        Herald::Config.default_store = Herald::Rails.default_store(app)
      end

      initializer "herald.middleware", after: :load_config_initializers do |app|
        herald = app.config.herald
        if herald.middleware
          options = MIDDLEWARE_KEYS.filter_map { |k| [k, herald[k]] unless herald[k].nil? }.to_h
          if app.config.api_only
            app.middleware.use(Herald::Rack::Middleware, **options)
          else
            # Behind the session, cookies and Warden, as message_bus: lookups see the signed-in user.
            app.middleware.insert_before(ActionDispatch::Flash, Herald::Rack::Middleware, **options)
          end
        end
        app.middleware.insert_before(::Rails::Rack::Logger, QuietPolls, base_route: herald.base_route) if herald.quiet_polls
      end

      initializer "herald.subscribers" do |app|
        Herald::Events.autostart = false # workers start in servers (plugin :herald) or by Herald.start_workers
        Herald::Events.handler_wrapper = Herald::Rails.handler_wrapper(app)
        Herald::Events.reload_check = Herald::Rails.reload_check(app)
        ::Rails.autoloaders.main.on_unload { |_cpath, value, _path| Herald::Rails.forget_unloaded(value) }
        app.config.to_prepare { Herald::Rails.load_subscribers(app) }
      end

      generators do
        require_relative "install_generator"
      end
    end
  end
end
