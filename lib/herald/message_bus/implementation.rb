# frozen_string_literal: true

module MessageBus
  # message_bus's module API over one Herald::Bus (built on first use from `configure`).
  module Implementation
    LOOKUPS = %i[user_id_lookup group_ids_lookup site_id_lookup is_admin_lookup on_middleware_error
      extra_response_headers_lookup on_connect on_disconnect].freeze

    def initialize
      @config = {}
      @mutex = Mutex.new
      @herald_bus = nil
      @subscriptions = [] # [channel, site_id, block, Herald::Subscription]
      @off = false
      @off_disable_publish = false
      @destroyed = false
      @shared = false # true: the bus is Herald.bus, not ours to close
    end

    def configure(config)
      @config.merge!(config)
    end

    def config = @config

    def redis_config = @config[:redis_config] || {}

    def redis_config=(config)
      configure(backend: :redis, redis_config: config)
    end

    def logger = @config[:logger] ||= Herald.logger

    def logger=(logger)
      configure(logger: logger)
    end

    LOOKUPS.each do |name|
      define_method(name) do |&blk|
        configure(name => blk) if blk
        @config[name]
      end
    end

    %i[long_polling_enabled chunked_encoding_enabled].each do |name|
      define_method(:"#{name}?") { @config[name] != false }
      define_method(:"#{name}=") { |val| configure(name => val) }
    end

    def max_active_clients = @config[:max_active_clients] || 1000

    # Milliseconds a long poll is held (message_bus's default: 25 000).
    def long_polling_interval = @config[:long_polling_interval] || 25_000

    def long_polling_interval=(millis)
      configure(long_polling_interval: millis)
    end

    # The debug route `{base}message-bus/broadcast?channel=&data=`: off unless set, or Rails in development/test.
    def allow_broadcast?
      return @config[:allow_broadcast] if @config.key?(:allow_broadcast)
      defined?(::Rails.env) ? (::Rails.env.test? || ::Rails.env.development?) : false
    end

    def allow_broadcast=(val)
      configure(allow_broadcast: val)
    end

    def max_active_clients=(val)
      configure(max_active_clients: val)
    end

    def keepalive_interval = @config[:keepalive_interval] || 60

    def keepalive_interval=(val)
      configure(keepalive_interval: val)
    end

    # message_bus: a leading and a trailing slash, no doubled ones.
    def base_route=(route)
      configure(base_route: route.gsub(%r{\A(?!/)|(?<!/)\z|//+}, "/"))
    end

    def base_route = @config[:base_route] || "/"

    def off? = @off

    def off(disable_publish: true)
      @off = true
      @off_disable_publish = disable_publish
    end

    def on
      @off = @off_disable_publish = @destroyed = false
    end

    def herald_bus
      @herald_bus || @mutex.synchronize { @herald_bus ||= open_bus }
    end

    def backend_instance = Backend::Instance.new(self)

    def publish(channel, data, opts = nil)
      return if @off_disable_publish
      raise BusDestroyed if @destroyed
      opts ||= {}
      user_ids, group_ids, client_ids = opts.values_at(:user_ids, :group_ids, :client_ids)
      raise InvalidMessage if (user_ids || group_ids) && global?(channel)
      raise InvalidMessageTarget if [user_ids, group_ids, client_ids].include?([])
      herald_bus.publish(channel, data, user_ids: user_ids, group_ids: group_ids, client_ids: client_ids,
        site_id: site_for(channel, opts[:site_id]), max_backlog_size: opts[:max_backlog_size], max_backlog_age: opts[:max_backlog_age])
    end

    # Every site's messages; with a last_id (>= 0) the backlog of the current site after it first. Returns
    # the block, as message_bus does (unsubscribe takes it).
    def subscribe(channel = nil, last_id = -1, &blk)
      subscribe_impl(channel, nil, last_id, blk)
    end

    # The current site's messages only (site_id_lookup).
    def local_subscribe(channel = nil, last_id = -1, &blk)
      subscribe_impl(channel, site_for(channel, nil), last_id, blk)
    end

    def unsubscribe(channel = nil, &blk)
      @mutex.synchronize do
        gone = @subscriptions.select { |ch, _site, b, _sub| ch == channel && (blk.nil? || b == blk) }
        @subscriptions -= gone
        gone.each { |*, sub| @herald_bus&.unsubscribe(sub) }
      end
    end

    def backlog(channel = nil, last_id = nil, site_id = nil)
      msgs = if channel
        herald_bus.backlog(channel, last_id.to_i, site_id: site_for(channel, site_id))
      else
        herald_bus.global_backlog(last_id.to_i)
      end
      msgs.map { |m| Message.from_herald(m) }
    end

    def global_backlog(last_id = nil) = backlog(nil, last_id)

    def last_id(channel, site_id = nil) = herald_bus.last_id(channel, site_id: site_for(channel, site_id))

    def last_ids(*channels, site_id: nil)
      channels.flatten.to_h { |c| [c, last_id(c, site_id)] }
    end

    def last_message(channel)
      id = last_id(channel)
      backlog(channel, id - 1).first if id > 0
    end

    def register_client_message_filter(channel_prefix, &blk)
      client_message_filters << [channel_prefix, blk] if blk
    end

    def client_message_filters = @config[:client_message_filters] ||= []

    def after_fork
      return if @destroyed
      herald_bus # a forked child's dispatcher is restarted by Herald::Bus on the next subscribe
    end

    def listening? = !@herald_bus.nil? && !@destroyed

    # Forgets every message (message_bus: backend reset!).
    def reset!
      reset_store! if @herald_bus
    end

    def destroy
      return if @destroyed
      @destroyed = true
      bus = @mutex.synchronize { @herald_bus.tap { @herald_bus = nil } }
      bus.close if bus && !@shared # Herald's default bus is closed by Herald (at exit, reset!)
    end

    private

    def subscribe_impl(channel, site_id, last_id, blk)
      return if @off
      raise BusDestroyed if @destroyed
      site_id ||= site_for(channel, nil) if last_id && last_id >= 0
      sub = herald_subscribe(channel, site_id, (last_id >= 0) ? last_id : nil, blk)
      @mutex.synchronize { @subscriptions << [channel, site_id, blk, sub] }
      blk
    end

    def herald_subscribe(channel, site_id, last_id, blk)
      herald_bus.subscribe(channel, last_id, site_id: channel && site_id) { |m| blk.call(Message.from_herald(m)) }
    end

    def open_bus
      @shared = !@config[:backend]
      return Herald.bus if @shared # (which opens the embedded log by default)
      Herald::Bus.new(store: Backend.store_for(@config), on_error: method(:subscriber_failed))
    end

    # A new empty store; the subscriptions go on from its first message. (Herald's default bus is Herald's:
    # Herald.reset! empties it.)
    def reset_store!
      old = @herald_bus
      return if @shared
      @herald_bus = nil
      old&.close
      Backend.wipe(@config[:backend], old.store) if old
      subs = @mutex.synchronize { @subscriptions.dup }
      fresh = subs.map { |ch, site, blk, _| [ch, site, blk, herald_subscribe(ch, site, 0, blk)] }
      @mutex.synchronize { @subscriptions = fresh }
    end

    # message_bus keys a channel by the site of site_id_lookup unless given one (never a /global/ channel).
    def site_for(channel, site_id)
      return nil if channel.nil? || global?(channel)
      site_id || @config[:site_id_lookup]&.call
    end

    def global?(channel) = channel&.start_with?("/global/")

    def subscriber_failed(error, msg)
      logger.warn "MessageBus subscriber failed on #{msg&.channel}: #{error.class}: #{error.message}"
    end
  end
end
