# frozen_string_literal: true

# Herald: a fast, durable message bus for Ruby web apps. One log, many readers.
#
# How a message flows (docs/architecture.md has the whole picture):
#   Herald.publish -> Bus#publish: checks, Codec#encode once -> Store#append: global id + per-channel id
#   -> the store wakes its readers: in this process the Rack reactor (Store#watch), the Bus dispatcher and the
#      event workers (Store#wait); other processes through Log::Wakeup sockets or Redis/PostgreSQL's Notifier
#   -> each reader reads the store after its own cursor (global_backlog) and delivers.
#
# The parts, in dependency order.
# Core: errors, logging, fork safety, codecs, the message value.
require_relative "herald/version"
require_relative "herald/errors"
require_relative "herald/logger"         # Herald.logger: where warnings go ($stderr, or Rails.logger)
require_relative "herald/fork_tracker"   # Process._fork hook: stores drop inherited connections
require_relative "herald/metrics"        # counters and histograms of this process (Herald::Web::Metrics exports them)
require_relative "herald/codec"          # codec interface + registry
require_relative "herald/codec/json"
require_relative "herald/codec/msgpack"
require_relative "herald/codec/raw"      # a String's bytes as given (ActionCable's payloads)
require_relative "herald/message"        # the immutable value every reader gets
# Stores: the contract, then Memory, the embedded Log, and what the networked stores share.
require_relative "herald/store"          # the store contract
require_relative "herald/store/limits"   # what every store accepts: ranges, sizes, the checks
require_relative "herald/store/controls" # pause / resume of durable readers, kept in the store
require_relative "herald/store/watchers" # Store#watch: appends wake an event loop directly
require_relative "herald/store/memory"   # reference store
require_relative "herald/store/log/record"    # the embedded log: frame + record layout
require_relative "herald/store/log/stored_message" # a message read from a record, sliced lazily
require_relative "herald/store/log/segment"   # one append-only file
require_relative "herald/store/log/index"     # what is retained, in memory
require_relative "herald/store/log/directory" # lock, meta, state, cursors, leases
require_relative "herald/store/log/syncer"    # fsync policies: interval thread, fatal failures
require_relative "herald/store/log/reservation" # ids reserved on disk before they are handed out
require_relative "herald/store/log/wakeup"    # cross-process wakeups
require_relative "herald/store/log/recovery"  # open, catch up, roll, retire
require_relative "herald/store/log/group_commit" # fsync :always, one fsync per batch of appenders
require_relative "herald/store/log/write_lease" # the write lock kept between appends, given up when asked
require_relative "herald/store/log/cursors"   # cursors and leases of durable readers
require_relative "herald/store/log/replacement" # a directory replaced under a running store: a reset
require_relative "herald/store/log/checker"   # verification for `herald check`
require_relative "herald/store/log"
require_relative "herald/store/packed"   # one binary string per message, for the networked stores
require_relative "herald/store/pool"     # connection pool (threads, forks, lost connections)
require_relative "herald/store/notifier" # listener thread: cross-process wakeups
require_relative "herald/store/backlog_cache" # channel backlogs kept until the listener hears a change
require_relative "herald/store/networked"     # what the Redis and PostgreSQL stores share: reads, waits
# The networked stores load their client gem (redis-client, pg) on first use, so apps need only the one they use.
Herald::Store.autoload :Redis, File.expand_path("herald/store/redis", __dir__)
Herald::Store.autoload :Postgres, File.expand_path("herald/store/postgres", __dir__)
# The bus and the facade's configuration.
require_relative "herald/subscription"
require_relative "herald/bus"            # publish / subscribe / backlog over one store
require_relative "herald/config"
require_relative "herald/cable"          # ActionCable's broadcastings: their channels (adapter: herald)
# Durable events: subscribers, workers, retries, dead letters.
require_relative "herald/events/event_codec"     # events: Structs and Hashes as MessagePack with class tags
require_relative "herald/events/instrumentation" # publish/process/retry/dead.herald (ActiveSupport or callbacks)
require_relative "herald/events/subscriber"      # the Herald::Subscriber mixin
require_relative "herald/events/registry"        # subscriber classes, event channels
require_relative "herald/events/dead_letters"    # /herald/dead/<Subscriber>, replay
require_relative "herald/events/delivery"        # one handler call: retries, backoff, dead letter
require_relative "herald/events/worker"          # one deferred subscriber: cursor, lease, batches
require_relative "herald/events/worker_pool"     # the threads, graceful shutdown
require_relative "herald/events/lag"             # how far a deferred subscriber is behind, from its cursor
require_relative "herald/events/inline_runner"   # deferred subscribers on the calling thread (tests)
require_relative "herald/events/runtime"         # publish_event, start_workers, shutdown, fork hook
require_relative "herald/events/signals"         # SIGTERM -> graceful shutdown
# HTTP: the message_bus protocol, SSE and MessagePack over Rack (the server and Rails load on demand).
require_relative "herald/rack/env_keys"          # the env keys Herald's HTTP layers pass to each other
require_relative "herald/rack/wire"              # the bytes of a message on the wire, built once per process
require_relative "herald/rack/poll_request"      # parsing and checking what a client sends
require_relative "herald/rack/client"            # who polls, where it is, what it may see
require_relative "herald/rack/connection"        # a parked client: modes and encodings
require_relative "herald/rack/pending_writes"    # bytes queued for a non-blocking socket
require_relative "herald/rack/socket_connection" # ... on a hijacked socket (Puma)
require_relative "herald/rack/queue_connection"  # ... through a Rack body (Falcon, fallback)
require_relative "herald/rack/reactor"           # the one event loop holding parked clients
require_relative "herald/rack/transport"         # the process's transport state: bus, event loop, reply cache
require_relative "herald/rack/responder"         # one request: backlog, reply or park
require_relative "herald/rack/reply_cache"       # replies to repeated polls, kept while the store is unchanged
require_relative "herald/rack/client_script"     # the browser client, served at {base}message-bus/herald.js
require_relative "herald/rack/middleware"        # the Rack middleware (message_bus protocol, SSE, msgpack)
# The dashboard (mount Herald::Web => "/herald"), loaded on first use, with Herald::Web::Metrics (Prometheus
# text) and Herald::Web::Health (200/503 for probes), which are Rack apps of their own too.
Herald.autoload :Web, File.expand_path("herald/web", __dir__)

# The facade: one default bus per process, built from Herald.configure.
module Herald
  @lock = Mutex.new
  @config = Config.new
  @bus = nil
  @opened_by = nil # the pid that built @bus
  @exit_hook = false
  EXIT_TIMEOUT = 5 # seconds deferred handlers get to finish at exit (Herald.shutdown before exit for more)

  class << self
    def configure
      @lock.synchronize do
        raise ConfigurationError, "Herald is already running; configure it before the first publish" if @bus
        yield @config
      end
      self
    end

    def bus
      @bus || @lock.synchronize { @bus ||= open_default_bus }
    end

    # Closes the default bus and forgets it, so Herald.configure can be called again (tests, forks).
    def reset!
      @lock.synchronize do
        Events.reset_runtime!
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

    # At a normal exit, the process that opened the default bus stops its workers and closes it; a Log
    # store left open makes the next process skip a reservation of ids. Forked children that inherited the
    # bus leave it to the parent. A publish from a later exit hook opens (and closes) it again.
    def close_at_exit
      @lock.synchronize do
        @exit_hook = false
        return unless @bus && @opened_by == Process.pid
        Events.runtime.shutdown(timeout: EXIT_TIMEOUT)
        @bus.close
        @bus = nil
      end
    rescue => e
      logger.warn "closing the store at exit failed: #{e.class}: #{e.message}"
    end

    private

    def open_default_bus
      bus = @config.build_bus.tap { @config.freeze }
      @opened_by = Process.pid
      at_exit { close_at_exit } unless @exit_hook
      @exit_hook = true
      bus
    end
  end
end

# Rails: a Railtie (middleware, logger, store per environment, app/subscribers, generator), only under Rails.
require_relative "herald/rails/railtie" if defined?(::Rails::Railtie)
