# frozen_string_literal: true

module MessageBus
  # message_bus's backend classes (MessageBus::BACKENDS[:redis] and so on: what its backend_spec.rb and code
  # reaching for a backend build) over Herald's stores. Payloads are message_bus's encoded Strings; message ids
  # are per channel on every store, as with message_bus's Redis backend.
  module Backends
    # One Herald::Bus on the store `backend:` names (Backend.store_for), with message_bus's blocking subscribe.
    class Base
      attr_accessor :max_backlog_size, :max_global_backlog_size, :max_backlog_age, :clear_every

      def initialize(config = {}, max_backlog_size = 1000)
        @config = config
        @max_backlog_size = max_backlog_size
        @max_global_backlog_size = 2000
        @max_backlog_age = 604_800
        @clear_every = config[:clear_every] || 1
        @lock = Mutex.new
        @subscriptions = [] # [channel, block, Herald::Subscription]
        @bus = nil
      end

      def publish(channel, data, opts = nil)
        opts ||= {}
        bus.publish(channel, data, **opts.slice(:user_ids, :group_ids, :client_ids, :site_id),
          max_backlog_size: opts[:max_backlog_size] || @max_backlog_size, max_backlog_age: opts[:max_backlog_age] || @max_backlog_age)
      end

      def last_id(channel) = bus.last_id(channel)

      def last_ids(*channels) = channels.map { |c| last_id(c) }

      def backlog(channel, last_id = 0) = bus.backlog(channel, last_id.to_i).map { |m| Message.from_herald(m) }

      def global_backlog(last_id = 0) = bus.global_backlog(last_id.to_i).map { |m| Message.from_herald(m) }

      def get_message(channel, message_id) = backlog(channel, message_id - 1).find { |m| m.message_id == message_id }

      # Blocks, as message_bus's does, until global_unsubscribe (or the thread is killed).
      def subscribe(channel, last_id = nil, &blk)
        sub = [channel, blk, herald_subscribe(channel, last_id, blk)]
        @lock.synchronize { @subscriptions << sub }
        sleep 0.05 while @lock.synchronize { @subscriptions.include?(sub) }
      ensure
        @lock.synchronize { @subscriptions.delete(sub) }
        @bus&.unsubscribe(sub[2]) if sub
      end

      def global_subscribe(last_id = nil, &blk) = subscribe(nil, last_id, &blk)

      def global_unsubscribe
        gone = @lock.synchronize { @subscriptions.slice!(0..) }
        gone.each { |*, sub| @bus&.unsubscribe(sub) }
      end

      # Every message gone, ids from 1 again; blocked subscribers carry on from the new store's first message.
      def reset!
        old = @lock.synchronize { @bus.tap { @bus = nil } } or return
        old.close
        Backend.wipe(@config[:backend], old.store)
        subs = @lock.synchronize { @subscriptions.dup }
        fresh = subs.to_h { |sub| [sub, herald_subscribe(sub[0], 0, sub[1])] }
        # In place: each blocked #subscribe waits while its own Array is listed.
        @lock.synchronize { fresh.each { |sub, herald| sub[2] = herald } }
      end

      def destroy
        global_unsubscribe
        @lock.synchronize { @bus.tap { @bus = nil } }&.close
      end

      # Herald's stores and buses reopen what they need in a forked child by themselves.
      def after_fork
      end

      # message_bus's test hook: Herald's backlogs expire by age only (docs/http.md: Ids after a backlog expires).
      def expire_all_backlogs!
        raise NotImplementedError, "Herald's backlogs expire by max_backlog_age only"
      end

      private

      def bus
        @bus || @lock.synchronize { @bus ||= Herald::Bus.new(store: Backend.store_for(@config.merge(backend: @config[:backend] || self.class::NAME))) }
      end

      def herald_subscribe(channel, last_id, blk)
        bus.subscribe(channel, last_id) { |m| blk.call(Message.from_herald(m)) }
      end
    end

    BACKENDS = %i[memory redis postgres log].to_h do |name|
      klass = Class.new(Base)
      klass.const_set(:NAME, name)
      const_set(name.to_s.capitalize, klass)
      [name, klass]
    end.freeze
  end

  BACKENDS = Backends::BACKENDS
end
