# frozen_string_literal: true

module Herald
  module Events
    # How far a deferred subscriber is behind, read from its cursor in the store: right in every process,
    # whichever one holds its lease (metrics, health checks, the dashboard).
    #
    #   messages  global ids after its cursor: messages of every channel (its worker moves past the ones it
    #             does not take without calling it, so a running worker keeps this near 0)
    #   seconds   how long the oldest of those has waited (the store's clock at append), 0.0 when none
    #   cursor    the saved cursor, nil when it never ran (its first worker starts after the last id then:
    #             nothing is behind)
    Lag = Struct.new(:subscriber, :cursor, :messages, :seconds) do
      def self.of(store, name, last: store.last_global_id, now: Time.now.to_f)
        cursor = store.load_cursor(name, default: nil)
        return new(name, cursor, 0, 0.0) if cursor.nil? || cursor >= last
        oldest = store.global_backlog(cursor, limit: 1).first
        new(name, cursor, last - cursor, oldest ? [now - oldest.created_at, 0.0].max : 0.0)
      end

      # Every deferred subscriber this process knows (the app's subscriber classes), by name.
      def self.names = Events.registry.deferred.map(&:subscriber_name).uniq.sort

      def self.all(store, names = self.names)
        last = store.last_global_id
        now = Time.now.to_f
        names.map { |name| of(store, name, last: last, now: now) }
      end
    end
  end
end
