# frozen_string_literal: true

require "herald"
require "herald/cable/listener"

module ActionCable
  module SubscriptionAdapter
    # `adapter: herald` in config/cable.yml: ActionCable's broadcasts go through a Herald store, so every
    # process that opens it (Puma workers, `bin/rails runner`, jobs) reaches every other, with no Redis on one
    # host (the embedded log), or through Redis or PostgreSQL across hosts.
    #
    #   production:
    #     adapter: herald
    #     store: redis://localhost:6379/0   # optional: a directory (embedded log), redis://, postgres://;
    #                                       # default: the app's Herald store (Herald.configure, config.herald.store)
    #     max_backlog_size: 1000            # optional: broadcasts kept per broadcasting (default 1000)
    #     max_backlog_age: 60               # optional: seconds they are kept (default 60)
    #     channel_prefix: myapp_production  # optional, as for the other adapters
    #     timeout: 5                        # any other key is an option of the store `store:` names
    #                                       # (Herald::Store::Redis/Postgres/Log: timeout, namespace, table, fsync...)
    #
    # A broadcast is stored once, as the bytes ActionCable hands over (any size up to the store's record
    # limit), on a channel of its own under Herald::Cable::PREFIX. Each process reads the store once for all
    # its subscribers (Herald::Cable::Listener) and calls them on ActionCable's event loop.
    class Herald < Base
      prepend ChannelPrefix

      # The adapter's own keys (id: ActionCable's); the others are the store's options.
      KEYS = %w[adapter channel_prefix id store max_backlog_size max_backlog_age].freeze

      def initialize(server)
        super
        cable = server.config.cable.to_h.transform_keys(&:to_s)
        @store_setting = cable["store"]
        @store_options = store_options(cable)
        @retention = retention(cable)
        # ActionCable 8.1+ runs callbacks on server.executor; 7.x on its event loop (both #post).
        @executor = server.respond_to?(:executor) ? server.executor : server.event_loop
        @lock = Mutex.new
        @bus = nil
        @listener = nil
      end

      def broadcast(channel, payload)
        bus.publish(::Herald::Cable.channel(channel), payload, **@retention)
      end

      def subscribe(channel, callback, success_callback = nil)
        listener.add(::Herald::Cable.channel(channel), callback, success_callback)
      end

      def unsubscribe(channel, callback)
        listener.remove(::Herald::Cable.channel(channel), callback)
      end

      def shutdown
        @lock.synchronize do
          @listener&.stop
          @listener = nil
          @bus&.close if @store_setting # a store of its own; the app's stays open for the app
          @bus = nil
        end
      end

      private

      # A Bus of its own over the store, with the raw codec: the payload is stored as given, and Herald's
      # publish_message.herald instrumentation fires for every broadcast.
      def bus = @bus || @lock.synchronize { open_bus }

      def open_bus = @bus ||= ::Herald::Bus.new(store: open_store, codec: :raw)

      # One per process: a forked child (Puma workers after preload) starts its own, the parent's threads
      # are not there.
      def listener
        @lock.synchronize do
          pid = ::Herald::ForkTracker.pid
          unless @listener && @listener_pid == pid
            @listener_pid = pid
            @listener = ::Herald::Cable::Listener.new(store: open_bus.store, executor: @executor)
          end
          @listener
        end
      end

      def open_store
        case @store_setting
        when nil then ::Herald.bus.store
        when String then ::Herald::Store.from_url(@store_setting, **@store_options)
        else raise ::Herald::ConfigurationError, "store: in config/cable.yml must be a directory or a URL, got #{@store_setting.inspect}"
        end
      rescue ArgumentError, ::Herald::InvalidArgumentError => e # an option the store does not take, or a bad value
        raise ::Herald::ConfigurationError, "config/cable.yml (adapter: herald): #{e.message}"
      end

      def store_options(cable)
        options = cable.except(*KEYS)
        return options.transform_keys(&:to_sym) if options.empty? || (@store_setting && !options.key?("url"))
        raise ::Herald::ConfigurationError, "config/cable.yml (adapter: herald): #{options.keys.first}: is an option of the " \
          "store, which `store:` names (a directory, redis:// or postgres:// URL); without it the app's Herald store is used"
      end

      def retention(cable)
        size = cable.fetch("max_backlog_size", ::Herald::Cable::DEFAULT_MAX_BACKLOG_SIZE)
        age = cable.fetch("max_backlog_age", ::Herald::Cable::DEFAULT_MAX_BACKLOG_AGE)
        ::Herald::Store::Limits.validate_retention!(size, age)
        {max_backlog_size: size, max_backlog_age: age}
      rescue ::Herald::InvalidArgumentError => e
        raise ::Herald::ConfigurationError, "config/cable.yml (adapter: herald): #{e.message}"
      end
    end
  end
end
