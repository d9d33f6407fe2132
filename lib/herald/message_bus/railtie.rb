# frozen_string_literal: true

module MessageBus
  # What message_bus's own Railtie does, for the drop-in: MessageBus::Rack::Middleware where message_bus puts
  # it (before ActionDispatch::Flash, behind the session and Warden; appended in API-only apps), skipped with
  # `config.skip_message_bus_middleware = true`, and Rails' logger. It takes the place of Herald's own
  # middleware (one server of `/message-bus/` per app), and the lookups set in config.herald count for
  # MessageBus when its own are not set. With no `backend:` configured, MessageBus uses Herald's bus: the store
  # the Herald Railtie picks per environment (config.herald.store, HERALD_STORE, storage/herald/<env>).
  class Railtie < ::Rails::Railtie
    initializer "message_bus.configure_init", before: "herald.middleware" do |app|
      herald = app.config.herald
      herald.middleware = false # MessageBus::Rack::Middleware serves message-bus/ with MessageBus's lookups
      Implementation::LOOKUPS.each do |name|
        MessageBus.configure(name => herald[name]) if herald[name] && !MessageBus.config[name]
      end
      skip = app.config.respond_to?(:skip_message_bus_middleware) && app.config.skip_message_bus_middleware
      unless skip
        if app.config.api_only
          app.middleware.use(MessageBus::Rack::Middleware)
        else
          app.middleware.insert_before(ActionDispatch::Flash, MessageBus::Rack::Middleware)
        end
      end
      MessageBus.logger = ::Rails.logger if ::Rails.logger
    end
  end
end
