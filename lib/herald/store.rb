# frozen_string_literal: true

require "securerandom"
require "socket"
require "uri"

module Herald
  # A store is the log every reader reads from. Four implementations share one contract
  # (test/store/contract.rb runs unchanged against each): Memory, Log, Redis, Postgres.
  #
  # Writing
  #   append(channel, payload, codec:, created_at: nil, user_ids: nil, group_ids: nil, client_ids: nil,
  #          site_id: nil, max_backlog_size: nil, max_backlog_age: nil) => Message
  #     `payload` is already encoded by `codec` (a Codec module). Assigns the next global id
  #     (strictly increasing, never reused, in commit order) and the next message id of the channel
  #     (from 1, contiguous per channel and site). `site_id` is part of the channel's key, as in message_bus.
  #     max_backlog_size / max_backlog_age (seconds), when given, become the channel's retention from now on.
  #     What it cannot keep and give back as given (Store::Limits: data over max_payload_bytes, retention out
  #     of range, targets that are not 64-bit Integers or Strings) raises InvalidMessageError before anything
  #     is stored or remembered; a bad id, limit or timeout given to the methods below, InvalidArgumentError.
  #   max_payload_bytes                         => Integer: the most data (as encoded) append takes;
  #     Limits::MAX_PAYLOAD_BYTES at most, on every store, so an app can move between them
  #
  # Reading
  #   last_id(channel, site_id: nil)            => Integer, 0 when empty
  #   last_ids(channels, site_id: nil)          => {channel => Integer}
  #   last_global_id                            => Integer, 0 when empty
  #   backlog(channel, last_id = 0, site_id: nil)  => [Message] message_id > last_id, oldest first, retained only
  #   global_backlog(last_id = 0, limit: nil)   => [Message] global_id > last_id, oldest first
  #   epoch                                     => String; changes when the store is reset (wiped, flushed)
  #   known_epoch                               => String; the epoch as this instance last saw it, without
  #     asking a server (what every HTTP reply names, see Rack::Responder#extra_headers). Readers keeping a
  #     position (Bus's dispatcher, Rack::Reactor, Events::Worker) compare it and start again when it changes:
  #     a reset store numbers its messages again
  #
  #   peek_last_global_id                       => Integer; last_global_id as cheaply as the store can: no lock
  #     (Memory, Log: an append in progress may not be seen yet), a round trip for the networked stores
  #
  # Capabilities (what readers decide by, never the store's class)
  #   local_reads?                              => true when reads answer from this process's memory (Memory,
  #     Log): an event loop may read inline; false when a read is a network round trip (Redis, PostgreSQL)
  #   data_dir                                  => String, the directory the store keeps its files in (Log), or nil
  #   bytes_on_disk                             => Integer bytes its records take on disk (Log), or nil
  #   watch { }                                 => a Store::Watchers::Watch (#cancel, #io, #readable) whose
  #     block runs whenever the last global id moves, or nil when the store cannot call back (networked stores:
  #     readers wait through `wait` on their own thread instead)
  #
  #   announced_backlog(last_id, limit: nil)   => [Message] or nil: after `wait`, what global_backlog would
  #     return when the wakeups brought the new records themselves (Redis: small ones), without a round trip;
  #     nil when they did not (always, on the other stores): the reader then reads global_backlog
  #
  # Waiting
  #   wait(last_global_id, timeout:)            => Integer last_global_id; returns at once when it is
  #     greater than the argument, else blocks until something is appended (by any process) or timeout.
  #     Raises ClosedError once the store is closed (also when close happens during the wait), so that
  #     reader loops end instead of spinning. (Log also returns when it found its directory replaced.)
  #
  # Durable readers (cursors and leases, for deferred subscribers)
  #   load_cursor(name, default: 0) => Integer (`default` when never saved); save_cursor(name, global_id)
  #     A damaged cursor raises CorruptCursorError (never reads as 0); save_cursor takes an Integer >= 0.
  #   lease(name) => a Lease (#release) when this process now owns `name`, nil when another owner has it.
  #     A lease held by a process that dies is freed (flock, advisory lock, key TTL).
  #   lease_holder(name) => "host:pid" of the process holding `name`'s lease, nil when nobody holds it
  #     (for operators: the dashboard; never used to decide who owns a lease)
  #
  # Controls (Store::Controls, for operators; every process obeys them through the store)
  #   pause(name) / resume(name) / paused?(name)  a deferred subscriber stops and starts reading
  #   mark_reset(name, dead_letter_id) / reset_mark(name)  an operator moved `name`'s cursor
  #
  # Operators
  #   retention(channel, site_id: nil) => [max_backlog_size, max_backlog_age]: the channel's retention (the
  #     store's defaults until a publish set its own); Redis and PostgreSQL answer as this process knows it
  #     (set by its own publishes), Memory and Log as stored
  #   stats => {String => value}: what the store reports of itself for people (the dashboard's Store page):
  #     "kind", the retention defaults ("max_backlog_size", "max_backlog_age"), and its own facts (the log's
  #     directory, segments, bytes, fsync policy, free disk; a networked store's server). Never decided by.
  #
  #   close
  module Store
    DEFAULT_MAX_BACKLOG_SIZE = 1000
    DEFAULT_MAX_BACKLOG_AGE = 7 * 24 * 60 * 60 # seconds, as message_bus

    SITE_SEPARATOR = "$|$"
    # The longest channel name, and site id, in bytes, on every store: PostgreSQL indexes the key they
    # make (a btree row holds ~2,700 bytes, and a key that does not compress must fit).
    MAX_CHANNEL_BYTES = 1024

    # The key a channel's message ids are counted under: message_bus keys sites the same way.
    def self.channel_key(channel, site_id)
      site_id.nil? ? channel : "#{channel}#{SITE_SEPARATOR}#{site_id}"
    end

    def self.new_epoch = SecureRandom.hex(8)

    # A server URL as operators may see it: without its password.
    def self.redact_url(url)
      uri = URI(url.to_s)
      uri.password = "***" if uri.password
      uri.to_s
    rescue URI::Error
      "(unparsable URL)"
    end

    # How a lease holder names itself (lease_holder): this host and process.
    def self.lease_holder_id = "#{Socket.gethostname}:#{Process.pid}"

    # The store a URL names, so one environment variable switches stores (HERALD_STORE):
    #   redis://host:6379/0, rediss://...      => Store::Redis
    #   postgres://..., postgresql://...       => Store::Postgres
    #   memory:                                => Store::Memory
    #   a directory path (or file:///path)     => Store::Log
    # Another store plugs in with its own scheme (it needs only the contract above):
    #   Herald::Store.register_url("mystore://", %r{\Amystore://}i) { |url, **options| MyStore.new(url: url, **options) }
    def self.from_url(url, **options)
      raise InvalidArgumentError, "store URL must be a String, got #{url.inspect}" unless url.is_a?(String)
      raise InvalidArgumentError, "store URL is empty: give redis://, postgres:// or a directory" if url.empty?
      _, _, build = @urls.find { |_, pattern, _| pattern.match?(url) }
      return build.call(url, **options) if build
      if url.match?(%r{\A[a-z][a-z0-9+.-]*://}i)
        raise InvalidArgumentError, "Unknown store URL scheme: #{url.inspect}, expected #{@urls.map(&:first).join(", ")} or a directory"
      end
      Log.new(dir: url, **options)
    end

    # name: how the scheme reads in error messages; pattern: matched against the whole URL; the block builds
    # the store from the URL and from_url's options. Registered later, tried later.
    def self.register_url(name, pattern, &build)
      @urls << [name, pattern, build].freeze
    end

    @urls = []
    register_url("redis://", %r{\Aredis://}i) { |url, **options| Redis.new(url: url, **options) }
    register_url("rediss://", %r{\Arediss://}i) { |url, **options| Redis.new(url: url, **options) }
    register_url("postgres://", %r{\Apostgres://}i) { |url, **options| Postgres.new(url: url, **options) }
    register_url("postgresql://", %r{\Apostgresql://}i) { |url, **options| Postgres.new(url: url, **options) }
    register_url("memory:", /\Amemory:/i) { |_url, **options| Memory.new(**options) }
    register_url("file://", %r{\Afile://}i) { |url, **options| Log.new(dir: url.sub(%r{\Afile://}i, ""), **options) }

    # A cursor is a global id: an Integer >= 0 within 64 bits. Checked before saving, so nothing else is ever stored.
    def self.validate_cursor!(global_id)
      return if global_id.is_a?(Integer) && global_id >= 0 && global_id.bit_length < 64
      raise InvalidArgumentError, "a cursor is a global id (an Integer from 0 to 2**63-1), got #{Limits.shown(global_id)}"
    end

    # A cursor as a network store returns it (nil when never saved). Anything but digits is damage, never
    # read as 0: that would run every retained event again.
    def self.parse_cursor(raw, name:, where:, default: 0)
      return default if raw.nil?
      return Integer(raw.to_s, 10) if raw.is_a?(Integer) ? raw >= 0 : raw.to_s.match?(/\A\d{1,19}\z/)
      raise CorruptCursorError.new("the cursor of #{name} in #{where} is damaged (#{raw.to_s[0, 40].inspect}): " \
        "write the last global id it is done with there, or delete it to start afresh, as a new subscriber does", name: name)
    end

    # Kept for callers from before Store::Limits: the same check.
    def self.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidMessageError)
      Limits.validate_retention!(max_backlog_size, max_backlog_age, error: error)
    end

    def self.validate_name_sizes!(channel, site_id)
      if channel.bytesize > MAX_CHANNEL_BYTES
        raise InvalidMessageError, "channel is #{channel.bytesize} bytes, over the #{MAX_CHANNEL_BYTES} every store accepts"
      end
      return unless site_id && site_id.bytesize > MAX_CHANNEL_BYTES
      raise InvalidMessageError, "site_id is #{site_id.bytesize} bytes, over the #{MAX_CHANNEL_BYTES} every store accepts"
    end

    # A channel's retention as this process knows it: the store's defaults until a publish names its own
    # (per-publish max_backlog_size / max_backlog_age become the channel's retention from then on).
    class Retention
      def initialize(max_backlog_size, max_backlog_age)
        @default = [max_backlog_size, max_backlog_age].freeze
        @by_key = {}
      end

      # => [size, age] for the channel key; a size or age given is remembered for the key first.
      def for(key, size = nil, age = nil)
        return @by_key.fetch(key, @default) unless size || age
        stored = (@by_key[key] ||= @default.dup)
        stored[0] = size if size
        stored[1] = age if age
        stored
      end
    end

    # The value a lease returns: release it to let another owner in.
    class Lease
      def initialize(&release)
        @release = release
      end

      def release
        @release&.call
        @release = nil
      end

      def held? = !@release.nil?
    end
  end
end
