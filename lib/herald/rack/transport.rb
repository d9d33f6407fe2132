# frozen_string_literal: true

module Herald
  module Rack
    # What answering a request under `message-bus/` needs in this process, given to each Responder by the
    # Middleware (which only routes): the options, the wire formats, the client message filters, the bus, the
    # event loop holding parked clients and the reply cache. The last three follow the bus: without a given
    # one it is Herald.bus at the time of the request, so after Herald.reset! the next request gets a new
    # reactor and an empty cache; a forked worker builds its own reactor.
    class Transport
      # Lookups whose answer changes which messages a client gets: with any of them set, no reply is shared.
      PER_CLIENT = %i[user_id_lookup group_ids_lookup site_id_lookup].freeze

      attr_reader :options, :prefix, :wire, :filters, :on_error

      # options: Middleware::DEFAULTS merged with the app's (frozen). bus: nil for Herald's default bus.
      def initialize(bus:, options:, prefix:)
        @bus = bus
        @options = options
        @prefix = prefix
        @wire = Wire.new
        @filters = options[:client_message_filters].to_a.freeze
        @shareable = @filters.empty? && PER_CLIENT.none? { |name| options[name] }
        @cache_polls = @shareable && options[:reply_cache]
        @on_error = options[:on_error] || ->(e) { Herald.logger.warn "http transport: #{e.class}: #{e.message}" }
        @reply_cache = nil
        @lock = Mutex.new
        @reactor = nil
        @pid = nil
      end

      # The bus given to new, else Herald.bus at the time of the request: building the middleware opens
      # nothing (a Rails app boots, runs `rails runner` or a rake task without touching the store).
      def bus = @bus || Herald.bus

      # True when a poll's reply may depend on nothing but the request and the store (see Responder#shared).
      def shareable? = @shareable

      # True when polls may be answered from the ReplyCache (shareable, and not switched off).
      def cache_polls? = @cache_polls

      # The event loop of this process; a forked worker builds its own, and so does a new default bus.
      def reactor
        bus = self.bus
        return @reactor if @pid == ForkTracker.pid && @reactor&.bus.equal?(bus)
        @lock.synchronize do
          return @reactor if @pid == ForkTracker.pid && @reactor&.bus.equal?(bus)
          @reactor&.close if @pid == ForkTracker.pid
          @reactor = Reactor.new(bus: bus, wire: @wire, filters: @filters, write_timeout: @options[:write_timeout], on_error: @on_error)
          @pid = ForkTracker.pid
          @reactor
        end
      end

      # The ReplyCache of the current store (a new bus after Herald.reset! starts an empty one); nil when off.
      def reply_cache
        return nil unless @cache_polls
        cache = @reply_cache
        return cache if cache && (@bus || cache.for?(Herald.bus.store)) # a given bus keeps its store
        @reply_cache = ReplyCache.new(store: bus.store, prefix: @prefix)
      end

      # True when the bus was given (not Herald's default, which Herald.reset! replaces).
      def given_bus? = !@bus.nil?

      def active_clients = (@pid == ForkTracker.pid && @reactor) ? @reactor.size : 0

      # Ends every parked client (each gets its final `[]`), then stops the event loop.
      def close
        @reactor&.close if @pid == ForkTracker.pid
        @reactor = nil
      end
    end
  end
end
