# frozen_string_literal: true

begin
  require "redis-client"
rescue LoadError
  # An optional dependency: only apps that use this store need the gem, and they get told which one.
  raise LoadError, "Herald::Store::Redis needs the redis-client gem: add `gem \"redis-client\"` to your Gemfile (or gem install redis-client)"
end
require_relative "redis/scripts"
require_relative "redis/batcher"
require_relative "redis/announcements"

module Herald
  module Store
    # Messages in Redis, shared by every process and host that points at the same server.
    #
    #   Herald::Store::Redis.new(url: ENV["REDIS_URL"], namespace: "herald", pool: 5,
    #     max_backlog_size: 1000, max_backlog_age: 7 * 86400, max_global_backlog_size: 10_000,
    #     max_payload_bytes: Limits::MAX_PAYLOAD_BYTES, on_reset: ->(old_epoch, new_epoch) { ... })
    #
    # One Lua script (Scripts::APPEND) assigns the global and channel ids, stores the record in the
    # channel's sorted set (once: the global set holds a reference), trims both and PUBLISHes a wakeup;
    # the concurrent publishes of a process share one script call (Batcher). A backlog is one
    # ZRANGEBYSCORE returning raw records (Store::Packed), decoded without touching `data`.
    # A reset (flush, restart without persistence, failover) is detected by the epoch and by ids going
    # backwards, reported to `on_reset`, and recovered from by restarting ids above everything seen; every
    # process drops its cached backlogs. A process learns the epoch on its first contact (an empty store is
    # given one), and its listener checks it every CHECK_EVERY seconds, so a reset is noticed even when
    # nobody publishes. A process that never saw the old data cannot tell a reset from a new store: what it
    # publishes before another process notices gets low ids (docs/stores.md, "When Redis loses data").
    #
    # `timeout:` (seconds, default 1) bounds each command's wait for its reply: a stalled server raises
    # Herald::TimeoutError. Reads are retried after a lost connection; reads and writes are retried while
    # the server answers LOADING or BUSY (it did not run the command), then raise Herald::ConnectionError.
    # Per-publish max_backlog_size/age overrides are remembered by this process (the first publish after a
    # restart falls back to the store defaults until it passes them again).
    class Redis
      include Networked
      include Controls

      DEFAULT_URL = "redis://127.0.0.1:6379/0"
      DEFAULT_POOL = 5
      DEFAULT_MAX_GLOBAL_BACKLOG_SIZE = 10_000
      LEASE_TTL = 30 # seconds; renewed every third of it while held
      RETRIES = [0.05, 0.2, 0.5].freeze # backoff for reads after a lost connection, for a loading or busy server
      # Refusals of a command the server did not run: a restart replaying its AOF, a long script.
      UNRUN = /\A(LOADING|BUSY|MASTERDOWN|TRYAGAIN)\b/
      # How often the listener checks the epoch while no wakeup comes: a FLUSHALL that nobody publishes
      # after is noticed (cache dropped, on_reset called) within this many seconds.
      CHECK_EVERY = 1.0
      GLOBAL_KEY = "refs" # schema 2 (Scripts): schema 1 kept a copy of every record in "global"
      GLOBAL_PAGE = 1000 # references resolved per script call: bounds how long one read holds the server

      attr_reader :url, :namespace, :driver, :max_payload_bytes

      # redis-client's CommandBuilder walks every argument twice (flatten, then to_s) on every call:
      # 4 us of a publish's ~12 us of Ruby. Herald's commands are flat; the publish builds every argument
      # as a String, which goes through untouched. Anything else gets redis-client's own treatment.
      module Commands
        def self.generate(args, kwargs = nil)
          return args if kwargs.nil? && args.all?(String)
          RedisClient::CommandBuilder.generate(args, kwargs)
        end
      end

      # :auto picks redis-client's C driver (the hiredis-client gem: replies parsed in C) when it is
      # installed, else the pure-Ruby one. :ruby or :hiredis force one.
      def self.driver(name)
        case name
        when :ruby then :ruby
        when :hiredis
          require "hiredis-client"
          :hiredis
        when :auto then hiredis? ? :hiredis : :ruby
        else raise InvalidArgumentError, "Unknown Redis driver #{name.inspect}, expected :auto, :ruby or :hiredis"
        end
      end

      def self.hiredis?
        return @hiredis unless @hiredis.nil?
        @hiredis = begin
          require "hiredis-client"
          true
        rescue LoadError
          false
        end
      end

      def initialize(url: ENV.fetch("REDIS_URL", DEFAULT_URL), namespace: "herald", pool: DEFAULT_POOL,
        max_backlog_size: DEFAULT_MAX_BACKLOG_SIZE, max_backlog_age: DEFAULT_MAX_BACKLOG_AGE,
        max_global_backlog_size: DEFAULT_MAX_GLOBAL_BACKLOG_SIZE, on_reset: nil, backlog_cache: true, connect_timeout: 1.0,
        timeout: 1.0, driver: :auto, max_payload_bytes: Limits::MAX_PAYLOAD_BYTES)
        Limits.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidArgumentError)
        Limits.validate_seconds!(:timeout, timeout)
        Limits.validate_seconds!(:connect_timeout, connect_timeout)
        # A record (Store::Packed: the data and 45 bytes, channel, site id, targets) is one Redis string and
        # one script argument: both end at 512 MB, well above any record Limits lets through.
        @max_payload_bytes = Limits.validate_max_payload!(max_payload_bytes)
        @url = url
        @driver = Redis.driver(driver)
        # `timeout` bounds every command's wait for its reply (a stalled server raises Herald::TimeoutError).
        @config = RedisClient.config(url: url, connect_timeout: connect_timeout, read_timeout: timeout,
          write_timeout: timeout, reconnect_attempts: 0, driver: @driver, command_builder: Commands)
        @namespace = namespace
        @max_global = max_global_backlog_size
        @checked = {} # channel key => until when its set outlives new records (APPEND's expiry check)
        @on_reset = on_reset || ->(old, new) { Herald.logger.warn "Redis store #{namespace} was reset (epoch #{old} -> #{new}): ids restart above the old ones" }
        @meta_key = "#{namespace}:meta"
        @ids_key = "#{namespace}:ids"
        @global_key = "#{namespace}:#{GLOBAL_KEY}"
        @wake_channel = "#{namespace}:wake"
        @channel_keys = {}
        @retention = Retention.new(max_backlog_size, max_backlog_age)
        @epoch = nil # the epoch this instance last saw
        @high = 0 # the highest global id this instance has seen
        @next_epoch = Store.new_epoch
        @leases = {}
        @closed = false
        @pool = Pool.new(size: pool, timeout: 5, connect: -> { connect }, close: ->(c) { c.close },
          abandon: ->(_) {}, broken: ->(e, _) { e.is_a?(RedisClient::ConnectionError) })
        @cache = BacklogCache.new if backlog_cache
        @batcher = Batcher.new { |requests| append_batch(requests) }
        @announced = Announcements.new
        @notifier = Notifier.new(listen: method(:listen), on_error: ->(e) {}, on_change: method(:changed))
        @fork_hook = ForkTracker.after_fork { after_fork }
      end

      def append(channel, payload, codec:, created_at: nil, user_ids: nil, group_ids: nil, client_ids: nil,
        site_id: nil, max_backlog_size: nil, max_backlog_age: nil)
        Limits.validate_append!(channel, site_id, payload, @max_payload_bytes, created_at)
        Limits.validate_retention!(max_backlog_size, max_backlog_age) if max_backlog_size || max_backlog_age
        targets = Limits.pack_targets(user_ids, group_ids, client_ids) # before `request` remembers the retention
        raise ClosedError, "store is closed" if @closed
        created_at = created_at&.to_f || Process.clock_gettime(Process::CLOCK_REALTIME)
        gid, mid = @batcher.call(request(channel, payload, codec, created_at, targets, site_id, max_backlog_size, max_backlog_age))
        Herald::Message.build(gid, mid, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
      end

      def last_id(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        read { |r| r.call_v(["HGET", @ids_key, Store.channel_key(channel, site_id)]) }.to_i
      end

      def last_ids(channels, site_id: nil)
        Limits.validate_keys!(channels, site_id)
        return {} if channels.empty?
        ids = read { |r| r.call_v(["HMGET", @ids_key, *channels.map { |c| Store.channel_key(c, site_id) }]) }
        channels.each_with_index.to_h { |c, i| [c, ids[i].to_i] }
      end

      def last_global_id
        known = @epoch
        epoch, gid = read { |r| r.call_v(["HMGET", @meta_key, "epoch", "gid"]) }
        observe(epoch, gid.to_i, known)
      end

      # Newest first, at most the channel's size (trimming is batched), then put back in order.
      def backlog(channel, last_id = 0, site_id: nil)
        Limits.validate_key!(channel, site_id)
        Limits.validate_id!(:last_id, last_id)
        key = Store.channel_key(channel, site_id)
        size = @retention.for(key).first
        cached(key, last_id) do
          records = read { |r| r.call_v(["ZRANGE", channel_key(key), "+inf", "(#{last_id}", "BYSCORE", "REV", "LIMIT", 0, size]) }
          Packed.decode_all(records.reverse!, channel)
        end
      end

      # Pages of GLOBAL_PAGE references, resolved to records by Scripts::GLOBAL (references to expired
      # channels are skipped there). Expired records are left out after the read: with a limit, it reads
      # on past them, so a page is never short while live messages follow.
      def global_backlog(last_id = 0, limit: nil)
        Limits.validate_id!(:last_id, last_id)
        Limits.validate_limit!(limit)
        found = []
        loop do
          want = limit ? [limit - found.size, GLOBAL_PAGE].min : GLOBAL_PAGE
          known = @epoch
          read_count, last_read, epoch, *records = read { |r| evalsha_with(r, Scripts::GLOBAL, [@global_key, @meta_key, last_id, want], keys: 2) }
          saw(epoch, 0, false, known) unless epoch.empty?
          messages = Packed.decode_all(records)
          @high = messages.last.global_id if messages.any? && messages.last.global_id > @high
          found.concat(Packed.unexpired(messages))
          return found if read_count < want || (limit && found.size >= limit)
          last_id = last_read.to_i
        end
      end

      # After `wait`: the records the wakeups since `last_id` carried, when they are all of them up to the
      # latest id this process heard of (Announcements), without a round trip; else nil (read global_backlog).
      def announced_backlog(last_id, limit: nil)
        return nil unless @notifier.ready?
        records = @announced.after(last_id, @notifier.latest, limit) or return nil
        Packed.unexpired(Packed.decode_all(records.dup))
      end

      def epoch
        last_global_id
        @epoch
      end

      # Kept fresh by every append and read of the meta and by the listener's periodic check.
      def known_epoch = @epoch || epoch

      def load_cursor(name, default: 0)
        raw = read { |r| r.call_v(["HGET", "#{@namespace}:cursors", name]) }
        Store.parse_cursor(raw, name: name, where: "the Redis hash #{@namespace}:cursors", default: default)
      end

      def save_cursor(name, global_id)
        Store.validate_cursor!(global_id)
        write { |r| r.call_v(["HSET", "#{@namespace}:cursors", name, global_id]) }
      end

      def lease(name)
        key = "#{@namespace}:lease:#{name}"
        token = "#{Store.new_epoch} #{Store.lease_holder_id}" # the holder reads in it (lease_holder)
        return nil unless write { |r| r.call_v(["SET", key, token, "NX", "PX", LEASE_TTL * 1000]) }
        @leases[key] = token
        start_renewer
        Lease.new do
          @leases.delete(key)
          write { |r| evalsha_with(r, Scripts::RELEASE, [key, token], keys: 1) } unless @closed
        end
      end

      def retention(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        @retention.for(Store.channel_key(channel, site_id)).dup
      end

      def stats
        size, age = @retention.for(nil)
        {"kind" => "redis", "server" => Store.redact_url(@url), "namespace" => @namespace,
         "max_backlog_size" => size, "max_backlog_age" => age, "driver" => @driver.to_s}
      end

      def lease_holder(name)
        token = read { |r| r.call_v(["GET", "#{@namespace}:lease:#{name}"]) }
        token&.split(" ", 2)&.last&.force_encoding(Encoding::UTF_8)&.scrub
      end

      # Forget connections and threads inherited from the parent. Runs by itself in a forked child
      # (Process._fork); call it yourself after a fork Ruby cannot see.
      def after_fork
        @pool.after_fork
        @batcher = Batcher.new { |requests| append_batch(requests) } # the parent's may be mid-call
        @leases.clear # the parent still holds them
        @announced.clear # the listener starts again here
        @renewer = nil
      end

      def close
        return if @closed
        @closed = true
        ForkTracker.remove(@fork_hook)
        @notifier.stop
        @renewer&.kill
        @leases.each_key { |k| write { |r| r.call_v(["DEL", k]) } rescue nil } # standard:disable Style/RescueModifier
        @pool.close
      end

      private

      def connect
        @config.new_client
      end

      # A channel's sorted set. Scripts::APPEND cuts the key back out of it at the length of @meta_key
      # ("<namespace>:meta" is as long as "<namespace>:ch:" plus one): the key is not sent twice.
      def channel_key(key)
        @channel_keys[key] ||= begin
          @channel_keys.clear if @channel_keys.size > 10_000
          "#{@namespace}:ch:#{key}"
        end
      end

      def clock_floor = Process.clock_gettime(Process::CLOCK_REALTIME, :second) << 20

      # What APPEND takes for one record: [channel_key, tail, kept, max_size, ttl_ms, slack, trim_first]:
      # `kept` is, when the script is to check the set's expiry, until when that check will keep the set
      # (else nil); the four numbers are its retention (Scripts::APPEND). A batched trim leaves up to size/16 extra
      # records: when the size grows, they go first (trimmed exactly to the old size), or the larger size
      # would bring back what was already dropped.
      def request(channel, payload, codec, created_at, targets, site_id, max_size, max_age)
        key = Store.channel_key(channel, site_id)
        before = @retention.for(key).first
        size, age = @retention.for(key, max_size, max_age)
        ttl = (age * 1000).ceil
        now = Process.clock_gettime(Process::CLOCK_REALTIME)
        checked = @checked[key]
        kept = (checked.nil? || now + age > checked) ? now + (ttl + [ttl / 16, 60_000].min / 2.0) / 1000.0 : nil
        tail = Packed.tail(channel, payload, codec, created_at, age, site_id, targets)
        [key, tail, kept, size, kept ? ttl : -ttl, (before == size) ? size / 16 : 0, (before < size) ? before : 0]
      end

      NUMKEYS = Array.new(Batcher::MAX + 1) { |n| (3 + n).to_s.freeze }.freeze
      NUMBERS = Array.new(Batcher::MAX + 1) { |n| "G#{3 + 4 * n}".freeze }.freeze # pack formats of APPEND's `numbers`

      # One APPEND call for the requests of a batch (`request`'s, each); returns
      # [global_id, message_id] for each, in order. The command is built as one array: this runs once per
      # publish when there is no concurrency. The reply carries the epoch only when it is not @epoch.
      def append_batch(requests)
        n = requests.size
        command = ["EVALSHA", Scripts::APPEND.sha, NUMKEYS[n] || (3 + n).to_s, @meta_key, @ids_key, @global_key]
        requests.each { |request| command << channel_key(request[0]) }
        known = @epoch
        request = requests[0]
        numbers = if n == 1
          [@high, clock_floor, @max_global, request[3], request[4], request[5], request[6]]
        else
          requests.each_with_object([@high, clock_floor, @max_global]) { |r, a| a.push(r[3], r[4], r[5], r[6]) }
        end
        command.push(known || "", numbers.pack(NUMBERS[n] || "G#{3 + 4 * n}") << @next_epoch, @wake_channel)
        requests.each { |request| command << request[1] }
        reply = write { |r| call_script(r, command, Scripts::APPEND) }
        first = reply[0]
        if reply.size > n + 1
          saw(reply[n + 1], first + n - 1, reply[n + 2] == 1, known)
        elsif first + n - 1 > @high
          @high = first + n - 1
        end
        if n == 1 # no concurrency: no blocks
          checked(request[0], request[2]) if request[2] # after `saw` forgot the old epoch's
          @notifier.notify(first, request[0])
          return [[first, reply[1]]]
        end
        requests.each { |request| checked(request[0], request[2]) if request[2] }
        i = 0
        requests.map do |request|
          i += 1
          @notifier.notify(first + i - 1, request[0])
          [first + i - 1, reply[i]]
        end
      end

      # The set of channel `key` is known to outlive any record published before `time` (wall clock,
      # seconds): APPEND checked its expiry.
      def checked(key, time)
        @checked.clear if @checked.size > 10_000
        @checked[key] = time
      end

      # `command` is EVALSHA's; a server that lost the script (restart, SCRIPT FLUSH) gets its source.
      def call_script(redis, command, script)
        redis.call_v(command)
      rescue RedisClient::CommandError => e
        raise unless e.message.start_with?("NOSCRIPT")
        redis.call_v(["EVAL", script.source, *command.drop(2)])
      end

      def evalsha_with(redis, script, args, keys:)
        redis.call_v(["EVALSHA", script.sha, keys, *args])
      rescue RedisClient::CommandError => e
        raise unless e.message.start_with?("NOSCRIPT")
        redis.call_v(["EVAL", script.source, keys, *args])
      end

      def unrun?(error) = error.is_a?(RedisClient::CommandError) && UNRUN.match?(error.message)

      # A lost connection (not a timeout: the server is stalled), or a command the server refused unrun.
      def retry_read?(error)
        (error.is_a?(RedisClient::ConnectionError) && !error.is_a?(RedisClient::TimeoutError)) || unrun?(error)
      end

      # Writes are not retried after a lost connection: the script may have run. A connection that could
      # not be made (a restart under way) sent nothing.
      def retry_write?(error) = unrun?(error) || error.is_a?(RedisClient::CannotConnectError)

      def herald_error(error)
        message = error.message.lines.first.to_s.strip
        case error
        when Herald::Error then error
        when RedisClient::ReadOnlyError
          ReplicaReadOnlyError.new("Redis at #{@url} is a read-only replica (#{message}): point the store at the primary")
        when RedisClient::TimeoutError then TimeoutError.new("Redis at #{@url} did not answer in time (timeout:): #{message}")
        when RedisClient::ConnectionError then ConnectionError.new("Redis at #{@url} is unreachable: #{message}")
        when RedisClient::CommandError
          unrun?(error) ? ConnectionError.new("Redis at #{@url} is not serving commands yet (#{message}): try again") : StoreError.new("Redis refused the command: #{message}")
        else error
        end
      end

      # Records what the server answered. A missing epoch is set (this process's first contact with an
      # empty store), so that a later restart or flush is noticed; a missing or changed epoch after one
      # was known, or ids below what this process has seen, is a reset, recovered from by RECOVER.
      def observe(epoch, gid, known)
        if epoch.nil? || gid < @high
          known = @epoch
          epoch, gid, reset = write do |r|
            evalsha_with(r, Scripts::RECOVER, [@meta_key, known || "", @high, clock_floor, @next_epoch, @wake_channel], keys: 1)
          end
        end
        saw(epoch, gid, reset == 1, known)
        gid
      end

      # A new epoch after a known one means the data this process read may be gone: the cached backlogs go
      # (other processes drop theirs on the keyless wakeup the scripts publish) and the app is told.
      # `known` is the epoch this process knew when the command was sent: when another thread has seen a
      # different one since, this answer may predate it (a read from before a reset another thread has
      # recovered from) and its epoch is not taken: it would bring the old epoch back and report a reset
      # from the new one to the old. If it was the newer one after all, the next contact tells (a publish
      # answers with the epoch when it is not the caller's; the listener checks every CHECK_EVERY).
      def saw(epoch, gid, reset, known)
        @high = gid if gid > @high
        return if epoch.nil? || epoch == @epoch || !known.equal?(@epoch)
        old = @epoch
        @epoch = epoch
        @checked.clear # the sets may be gone: APPEND checks each again
        @next_epoch = Store.new_epoch if epoch == @next_epoch
        return unless old || reset
        @cache&.clear
        @on_reset.call(old, epoch)
      end

      # The notifier's listener: a dedicated connection in SUBSCRIBE mode, blocking on the socket.
      def listen(notifier)
        client = @config.new_client(read_timeout: CHECK_EVERY + 5)
        pubsub = client.pubsub
        pubsub.call_v(["SUBSCRIBE", @wake_channel])
        pubsub.next_event(5) # the subscribe confirmation
        notifier.ready(last_global_id)
        until @closed
          event = pubsub.next_event(CHECK_EVERY)
          next last_global_id unless event # quiet: has the store been flushed meanwhile?
          next unless event[0] == "message"
          heard(notifier, event[2])
        end
      ensure
        pubsub&.close
      end

      # A wakeup: `<gid>,<channel key>`, `<gid>;<record>` (Scripts::APPEND: a small record, kept for
      # announced_backlog before any reader is woken), or `<gid>` alone (a reset).
      def heard(notifier, data)
        digits = 0
        digits += 1 while (byte = data.getbyte(digits)) && byte >= 48 && byte <= 57
        gid = data.byteslice(0, digits).to_i
        return notifier.notify(gid, data.byteslice(digits + 1, data.bytesize)) unless byte == 59 # ";"
        record = data.byteslice(digits + 1, data.bytesize).force_encoding(Encoding::BINARY)
        message = Packed::Message.new(record)
        @announced.add(gid, record)
        notifier.notify(gid, Store.channel_key(message.channel, message.site_id))
      end

      # Before any reader is woken (Notifier's on_change): a channel's cached backlog goes; a wakeup without
      # a record (nil: a reset, or a connection lost or made, when wakeups may have been missed) ends the
      # run of announced records.
      def changed(key)
        @cache&.invalidate(key)
        @announced.clear if key.nil?
      end

      def renew_leases
        @leases.dup.each { |key, token| write { |r| evalsha_with(r, Scripts::RENEW, [key, token, LEASE_TTL * 1000], keys: 1) } }
      rescue Herald::Error
        nil # the next round tries again; a lease lost meanwhile is lost (its TTL let another owner in)
      end

      def start_renewer
        return if @renewer&.alive?
        @renewer = Thread.new do
          until @closed || @leases.empty?
            sleep LEASE_TTL / 3.0
            renew_leases
          end
        end
      end
    end
  end
end
