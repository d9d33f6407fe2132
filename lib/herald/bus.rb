# frozen_string_literal: true

module Herald
  # publish / subscribe / backlog over one store and one codec.
  #
  # Subscriptions are fed by one dispatcher thread per bus: it waits on the store (which wakes it for
  # appends from this and other processes), reads the global backlog after its cursor and hands each
  # message to the subscriptions that match. Callbacks run on that thread; an exception in one is
  # reported to `on_error` and never stops the others.
  class Bus
    GLOBAL_PREFIX = "/global/"
    # Channels whose names were checked, kept by each bus: checking a name again was a tenth of a publish's
    # instructions. A Hash finds a String by its bytes and encoding (a name with the same bytes in an
    # encoding it is not valid in is not found), so what it holds stays valid; past this many it starts over.
    VALID_NAMES = 1024
    # How long the dispatcher blocks in one wait: also the longest a new subscription waits for its backlog.
    WAIT_SLICE = 0.1
    BATCH = 1000
    # Instrumentation event of every publish (see Herald::Instrumentation).
    PUBLISH_MESSAGE = "publish_message.herald"

    attr_reader :store, :codec

    def initialize(store: Store::Memory.new, codec: :json, on_error: nil)
      @store = store
      @codec = Codec.fetch(codec)
      @on_error = on_error || ->(error, msg) { Herald.logger.warn "subscriber failed on #{msg&.channel}: #{error.class}: #{error.message}" }
      @lock = Mutex.new
      @subscriptions = []
      @pending = [] # new subscriptions, caught up by the dispatcher before they go live
      @dispatcher = nil
      @closed = false
      @valid_names = {} # channel => its name as stored (UTF-8, frozen): the channels checked so far
      @epoch = nil # the store's epoch the dispatcher's cursor belongs to
      @last_read = nil # the last message the dispatcher read (restart: is it still there after a reset?)
    end

    # Returns the message's per-channel id, as message_bus does. (Keywords spelled out: forwarding
    # **options would allocate a Hash on every publish.)
    def publish(channel, data, user_ids: nil, group_ids: nil, client_ids: nil, site_id: nil,
      max_backlog_size: nil, max_backlog_age: nil)
      publish_positional(channel, data, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age).message_id
    end

    # As publish, returning the whole Herald::Message.
    def publish_message(channel, data, user_ids: nil, group_ids: nil, client_ids: nil, site_id: nil,
      max_backlog_size: nil, max_backlog_age: nil)
      publish_positional(channel, data, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age)
    end

    # Reads refuse the names publish refuses (InvalidArgumentError): such a name is no channel ("a$|$b" would
    # read channel "a" of site "b"), and a wrong type must not reach the store as a key.
    def last_id(channel, site_id: nil)
      validate_channel!(channel, InvalidArgumentError)
      @store.last_id(channel, site_id: site_key(channel, site_name(site_id, InvalidArgumentError)))
    end

    def last_ids(*channels, site_id: nil)
      channels = channels.flatten
      channels.each { |c| validate_channel!(c, InvalidArgumentError) }
      site_id = site_name(site_id, InvalidArgumentError)
      return @store.last_ids(channels, site_id: site_id) unless site_id && channels.any? { |c| global?(c) }
      channels.to_h { |c| [c, last_id(c, site_id: site_id)] }
    end

    def backlog(channel, last_id = 0, site_id: nil)
      validate_channel!(channel, InvalidArgumentError)
      @store.backlog(channel, last_id, site_id: site_key(channel, site_name(site_id, InvalidArgumentError)))
    end

    def global_backlog(last_id = 0, limit: nil) = @store.global_backlog(last_id, limit: limit)

    # subscribe(channel) { |msg| }           new messages on channel, from every site (msg.site_id says which)
    # subscribe(channel, last_id) { |msg| }  backlog after last_id first, then new ones: no gap, no duplicate
    #                                        (the backlog of the channel without a site, as message_bus)
    # subscribe(channel, site_id: "s")       that site only; last_id is then a message id of that site
    # subscribe { |msg| }                    every channel (last_id, if given, is a global id)
    def subscribe(channel = nil, last_id = nil, site_id: nil, &block)
      raise InvalidArgumentError, "subscribe needs a block" unless block
      raise ClosedError, "bus is closed" if @closed
      Store::Limits.validate_id!(:last_id, last_id) if last_id
      sub = if channel
        validate_channel!(channel, InvalidArgumentError)
        channel_subscription(channel, last_id, site_key(channel, site_name(site_id, InvalidArgumentError)), block)
      else
        Subscription.new(bus: self, channel: nil, site_id: nil, last_id: last_id || @store.last_global_id, catch_up: true, callback: block)
      end
      @lock.synchronize do
        @pending << sub
        # A forked child inherits the bus but not its dispatcher thread: start one again there.
        @dispatcher = Thread.new { dispatch_loop }.tap { |t| t.name = "herald-dispatcher" } unless @dispatcher&.alive?
      end
      sub
    end

    def unsubscribe(sub)
      @lock.synchronize do
        @subscriptions.delete(sub)
        @pending.delete(sub)
      end
    end

    def close
      @closed = true
      @dispatcher&.join(2 * WAIT_SLICE + 1)
      @store.close
    end

    # On one site: counted by that site's message ids. On every site (site_id nil): by global ids from now.
    def channel_subscription(channel, last_id, site_id, block)
      floor = site_id ? nil : @store.last_global_id
      last_id ||= @store.last_id(channel, site_id: site_id) if site_id
      Subscription.new(bus: self, channel: channel, site_id: site_id, last_id: last_id, global_floor: floor, catch_up: true, callback: block)
    end

    # Raises as publish would for this channel name (for code that appends through the store itself:
    # durable events). Returns the channel as publish stores it (tagged UTF-8).
    def check_channel!(channel)
      validate_channel!(channel)
      text!(:channel, channel)
      Store.validate_name_sizes!(channel, nil)
      utf8(channel)
    end

    private

    # Both publishes, with positional arguments: passing eight keywords on costs more than the call.
    def publish_positional(channel, data, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age)
      raise ClosedError, "bus is closed" if @closed
      # A channel published to before, without a site or targets, needs no checks again (VALID_NAMES).
      if site_id || user_ids || group_ids || client_ids || !(name = @valid_names[channel])
        site_id = validate!(channel, user_ids, group_ids, client_ids, site_id)
        name = valid_name(channel)
      end
      channel = name
      bytes = @codec.encode(data)
      unless Instrumentation.listening?(PUBLISH_MESSAGE)
        return append(channel, bytes, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age)
      end
      # A publish the store will refuse is not reported as one: its checks first, outside the event.
      Store::Limits.pack_targets(user_ids, group_ids, client_ids)
      Store::Limits.validate_retention!(max_backlog_size, max_backlog_age)
      # Never the targets: client ids are bearer tokens, and user/group ids are the app's business.
      payload = {channel: channel, site_id: site_id, bytes: bytes.bytesize, targeted: !!(user_ids || group_ids || client_ids)}
      Instrumentation.instrument(PUBLISH_MESSAGE, payload) do
        append(channel, bytes, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age).tap do |msg|
          payload[:message_id] = msg.message_id
          payload[:global_id] = msg.global_id
        end
      end
    end

    # Counted and timed for Herald::Metrics (no allocation: the clock's Floats are immediates).
    def append(channel, bytes, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      msg = @store.append(channel, bytes, codec: @codec, user_ids: user_ids, group_ids: group_ids, client_ids: client_ids,
        site_id: site_id, max_backlog_size: max_backlog_size, max_backlog_age: max_backlog_age)
      Metrics::PUBLISH_DURATION.observe(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      Metrics::PUBLISHED.add
      msg
    end

    # The channel's name as stored, remembered once validate! accepted it.
    def valid_name(channel)
      name = utf8(channel)
      @valid_names.clear if @valid_names.size >= VALID_NAMES
      @valid_names[channel] = name
    end

    # The store checks the rest once (targets, retention, the data's size: Store::Limits), for every way in.
    def validate!(channel, user_ids, group_ids, client_ids, site_id)
      validate_channel!(channel)
      text!(:channel, channel)
      site_id = site_name(site_id)
      Store.validate_name_sizes!(channel, site_id)
      if global?(channel) && (user_ids || group_ids)
        raise InvalidMessageError, "user_ids and group_ids cannot target a /global/ channel"
      end
      site_key(channel, site_id)
    end

    # Any non-empty String names a channel, with or without a leading / (message_bus accepts `abc` too).
    # The site separator cannot be allowed: "a$|$b" without a site and "a" on site "b" would share one key.
    # (InvalidMessageError at publish, InvalidArgumentError on reads and subscribe.)
    def validate_channel!(channel, error = InvalidMessageError)
      raise error, "channel must be a non-empty String, got #{Store::Limits.shown(channel)}" unless channel.is_a?(String) && !channel.empty?
      return unless channel.include?(Store::SITE_SEPARATOR)
      raise error, "channel must not contain #{Store::SITE_SEPARATOR} (it separates channel and site id in the store's keys), got #{channel.inspect}"
    end

    # Channel names and site ids are UTF-8 text, stored as bytes and read back as UTF-8 by every store.
    def text!(name, value, error = InvalidMessageError)
      return if value.valid_encoding? && (value.encoding == Encoding::UTF_8 || value.ascii_only?)
      raise error, "#{name} must be valid UTF-8, got #{value.encoding} #{value.dump[0, 60]}"
    end

    # An ASCII name in another encoding (Rack's env strings are ASCII-8BIT, Integer#to_s gives US-ASCII) is
    # tagged UTF-8 here, as every store but Memory returns it anyway.
    def utf8(name) = (name.encoding == Encoding::UTF_8) ? name : name.dup.force_encoding(Encoding::UTF_8).freeze

    # A site id is a String ("" is a site of its own, as in message_bus); Symbols and Integers are named
    # by their text, so every store returns the same String.
    def site_name(site_id, error = InvalidMessageError)
      case site_id
      when nil then nil
      when String then utf8(site_id.tap { text!(:site_id, site_id, error) })
      when Symbol, Integer then utf8(site_id.to_s)
      else raise error, "site_id must be a String (or a Symbol or Integer, named by its text), got #{site_id.class}"
      end
    end

    # /global/ channels are shared by every site, so they are never keyed by site.
    def site_key(channel, site_id) = global?(channel) ? nil : site_id

    def global?(channel) = channel.start_with?(GLOBAL_PREFIX)

    # The cursor survives errors (a lost Redis/PostgreSQL connection): re-reading it after a failure
    # would skip whatever was appended meanwhile. It belongs to the store's epoch: a reset store (a log
    # directory replaced, a flushed Redis) numbers its messages again, and its messages are delivered from
    # its start (restart).
    def dispatch_loop
      cursor = nil
      begin
        @epoch ||= @store.known_epoch
        cursor ||= @store.last_global_id
        @last_read ||= @store.global_backlog(cursor - 1, limit: 1).first if cursor > 0 # what `restart` looks for
        until @closed
          activate_pending
          @store.wait(cursor, timeout: WAIT_SLICE)
          cursor = (@store.known_epoch == @epoch) ? dispatch_after(cursor) : restart(cursor)
        end
      rescue ClosedError
        nil
      rescue => e
        @on_error.call(e, nil)
        sleep WAIT_SLICE
        retry unless @closed
      end
    end

    def activate_pending
      return if @pending.empty?
      fresh = @lock.synchronize { @pending.shift(@pending.size) }
      fresh.each_with_index do |sub, i|
        sub.catch_up(@store).each { |msg| safely(msg) { sub.deliver(msg) } }
        @lock.synchronize { @subscriptions << sub if sub.active? }
      rescue
        # The store failed the catch-up read (a lost connection): this subscription and the ones after it
        # go back to pending, to be caught up on the dispatcher's next round, never dropped.
        @lock.synchronize { @pending.unshift(*fresh[i..]) }
        raise
      end
    end

    # The store was reset (its epoch changed). What is new to the subscriptions depends on where its ids went:
    # - above the cursor (a flushed Redis keeps a watermark: ids restart above the old ones), or the last
    #   message read is still there (the epoch changed again, two processes noticing one flush): read on after
    #   the cursor; starting over would deliver again what was read after the reset, before it was noticed;
    # - below it (a replaced log directory; a Redis restarted empty, then written by a process that never saw
    #   the old ids): what the store holds is new, and every subscription starts from its first message;
    # - nowhere yet (nothing stored since): decided once something is (the epoch is left as it was).
    def restart(cursor)
      first = @store.global_backlog(0, limit: 1).first
      return [cursor, @store.last_global_id].max unless first # (a floor with no message under it: no spin)
      @epoch = @store.known_epoch
      return dispatch_after(cursor) if first.global_id > cursor || still_there?(@last_read)
      floor = @store.last_global_id
      @lock.synchronize { @subscriptions.each(&:restart) }
      [dispatch_after(0), floor].max
    end

    def still_there?(msg)
      return false unless msg
      now = @store.global_backlog(msg.global_id - 1, limit: 1).first
      now == msg && now.created_at == msg.created_at
    end

    # Reads after `cursor` and delivers; a batch read while the epoch changed is left to `restart`.
    def dispatch_after(cursor)
      loop do
        batch = @store.global_backlog(cursor, limit: BATCH)
        return cursor if batch.empty? || @store.known_epoch != @epoch
        subs = @lock.synchronize { @subscriptions.dup }
        batch.each do |msg|
          subs.each { |sub| safely(msg) { sub.deliver(msg) } }
        end
        @last_read = batch.last
        cursor = @last_read.global_id
      end
    end

    def safely(msg)
      yield
    rescue => e
      @on_error.call(e, msg)
    end
  end
end
