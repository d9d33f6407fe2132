# frozen_string_literal: true

module Herald
  module Events
    EVENTS_PREFIX = "/events/"

    # The event channel of a class: Admin::UserRegistered => "/events/admin/user_registered".
    def self.channel_for(event_class)
      name = event_class.name or raise EventEncodingError, "#{event_class.inspect} is anonymous: assign it to a constant, or pass channel:"
      path = name.gsub("::", "/").gsub(/([A-Z\d]+)([A-Z][a-z])/, '\1_\2').gsub(/([a-z\d])([A-Z])/, '\1_\2').downcase
      -"#{EVENTS_PREFIX}#{path}"
    end

    # Every subscriber class of this process, and the lookups publish_event makes on each call, cached
    # until a subscriber is added or changed.
    class Registry
      def initialize
        @lock = Mutex.new
        @subscribers = []
        changed
      end

      # Keyed by class name: a class reloaded under the same name (Rails development, Zeitwerk) takes the
      # old one's place, so stale code stops handling events and nothing runs twice.
      def register(subscriber)
        @lock.synchronize do
          index = @subscribers.index { |s| s.equal?(subscriber) || (subscriber.name && s.name == subscriber.name) }
          index ? @subscribers[index] = subscriber : @subscribers << subscriber
        end
        changed
      end

      # The class registered now under `subscriber`'s name (itself unless it was reloaded since).
      def current(subscriber)
        return subscriber unless subscriber.name
        @lock.synchronize { @subscribers.find { |s| s.name == subscriber.name } } || subscriber
      end

      def unregister(subscriber)
        @lock.synchronize { @subscribers.delete(subscriber) }
        changed
      end

      def clear
        @lock.synchronize { @subscribers.clear }
        changed
      end

      # Bumped on every change, so the runtime notices deferred subscribers declared after the first publish.
      attr_reader :generation

      def changed
        @channels = {}
        @sync = {}
        @generation = (@generation || 0) + 1
      end

      def subscribers = @lock.synchronize { @subscribers.dup }

      def deferred = subscribers.select(&:deferred?)

      def find(name)
        subscribers.find { |s| s.subscriber_name == name.to_s } or
          raise SubscriberError, "no subscriber named #{name}: require the file that defines it (known: #{subscribers.map(&:subscriber_name).join(", ")})"
      end

      def channel_for(event_class) = @channels[event_class] ||= Events.channel_for(event_class)

      # Synchronous subscribers of an event class published on a channel, in the order they subscribed.
      def sync_for(event_class, channel)
        by_channel = @sync[event_class] ||= {}
        by_channel[channel] ||= subscribers.select { |s| !s.deferred? && s.handles?(event_class, channel) }.freeze
      end
    end

    @registry = Registry.new

    class << self
      attr_reader :registry
    end
  end
end
