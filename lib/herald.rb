# frozen_string_literal: true

# Herald: a fast, durable message bus for Ruby web apps. One log, many readers.
#
# The parts, in dependency order:
require_relative "herald/version"
require_relative "herald/errors"
require_relative "herald/fork_tracker"   # Process._fork hook: stores drop inherited connections
require_relative "herald/codec"          # codec interface + registry
require_relative "herald/codec/json"
require_relative "herald/codec/msgpack"
require_relative "herald/message"        # the immutable value every reader gets
require_relative "herald/store"          # the store contract
require_relative "herald/store/memory"   # reference store
require_relative "herald/store/record"   # one binary string per message, for the networked stores
require_relative "herald/store/pool"     # connection pool (threads, forks, lost connections)
require_relative "herald/store/notifier" # listener thread: cross-process wakeups
# The networked stores load their client gem (redis-client, pg) on first use, so apps need only the one they use.
Herald::Store.autoload :Redis, File.expand_path("herald/store/redis", __dir__)
Herald::Store.autoload :Postgres, File.expand_path("herald/store/postgres", __dir__)
require_relative "herald/subscription"
require_relative "herald/bus"            # publish / subscribe / backlog over one store
require_relative "herald/config"

# The facade: one default bus per process, built from Herald.configure.
module Herald
  @lock = Mutex.new
  @config = Config.new
  @bus = nil

  class << self
    def configure
      @lock.synchronize do
        raise ConfigurationError, "Herald is already running; configure it before the first publish" if @bus
        yield @config
      end
      self
    end

    def bus
      @bus || @lock.synchronize { @bus ||= @config.build_bus.tap { @config.freeze } }
    end

    # Closes the default bus and forgets it, so Herald.configure can be called again (tests, forks).
    def reset!
      @lock.synchronize do
        @bus&.close
        @bus = nil
        @config = Config.new
      end
    end

    def publish(...) = bus.publish(...)

    def subscribe(...) = bus.subscribe(...)

    def backlog(...) = bus.backlog(...)

    def global_backlog(...) = bus.global_backlog(...)

    def last_id(...) = bus.last_id(...)

    def last_ids(...) = bus.last_ids(...)
  end
end
