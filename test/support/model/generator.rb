# frozen_string_literal: true

require_relative "text"

module Herald
  module Model
    # Random operation sequences, as Hashes ({op: :publish, ...}). The sequence depends on the seed only
    # (never on what a store answers), so `SEED=n` replays it against any store.
    #
    # Channels and sites come from small pools drawn at the start, so reads hit what was published.
    class Generator
      SHORT_AGES = [0.3, 0.6, 1.0, 2.0].freeze # seconds: these messages expire during a run
      LONG_AGES = [3600, 86_400, 30 * 86_400].freeze
      MAX_SUBSCRIPTIONS = 6
      # Retention at the limits of every field (Store::Limits): the largest and smallest taken, and values
      # that would wrap in 32 or 64 bits, or are no size or age at all (refused by every store alike).
      SIZE_EXTREMES = [1, Store::Limits::MAX_BACKLOG_SIZE, Store::Limits::MAX_BACKLOG_SIZE + 1, 2**32 + 2, 2**64, 2**70,
        0, -1, -2**63, 1.0, "3"].freeze
      AGE_EXTREMES = [Store::Limits::MAX_BACKLOG_AGE, Store::Limits::MAX_BACKLOG_AGE + 1, 0, -1, -0.0, Float::INFINITY,
        Float::NAN, "60", 2**64].freeze
      # Ids and limits at the edges of 64 bits, and values that are no id (refused alike).
      ID_EXTREMES = [-1, -2**63, 2**63 - 1, 2**63, 2**64, 2**70, -2**64, "3", nil, 1.5, Float::NAN, Float::INFINITY].freeze
      TARGET_EXTREMES = [0, -2**63, 2**64 - 1, 2**63, -2**63 - 1, 2**64, 2**70, 1.5, Float::NAN, :sym].freeze
      WEIGHTS = {publish: 45, backlog: 15, last_id: 7, last_ids: 5, global_backlog: 8, subscribe: 3, finish: 2,
                 reopen: 1, fork: 0.6, sleep: 0.4, replace_dir: 0.3}.freeze

      attr_reader :text

      # slashless: also name channels without a leading "/" (when the Bus accepts them, as message_bus does).
      # payload_limit: the stores' max_payload_bytes; below Store::Limits::MAX_PAYLOAD_BYTES, some data is
      # encoded to exactly that many bytes, one fewer or one more.
      def initialize(seed, slashless: false, payload_limit: Store::Limits::MAX_PAYLOAD_BYTES)
        @payload_limit = payload_limit
        @random = Random.new(seed)
        @text = Text.new(@random)
        @channels = Array.new(@text.int(4..10)) { channel_name(slashless) }.uniq
        # ASCII names also come in the encodings apps hand over: Rack's env strings are ASCII-8BIT,
        # Integer#to_s gives US-ASCII.
        @sites = [nil, nil, nil, "", "a", "site-1", @text.name(3), @text.name(4), "example.com".b, "42".encode("US-ASCII")].uniq
        @channels << "/ascii/rack".b << "/ascii/#{@text.int(0..99)}".encode("US-ASCII")
        @ages = {} # channel key => the max_backlog_age it was given
        @published = Hash.new(0) # channel key => publishes generated (an upper bound of its last id)
        @total = 0
        @open = [] # subscription numbers not yet finished
        @subscriptions = 0
      end

      def next_op
        op = pick_op
        send(op)
      end

      private

      def pick_op
        weights = WEIGHTS.reject { |op, _| (op == :subscribe && @open.size >= MAX_SUBSCRIPTIONS) || (op == :finish && @open.empty?) }
        roll = @random.rand * weights.values.sum
        weights.each do |op, w|
          return op if (roll -= w) < 0
        end
        :publish
      end

      def channel_name(slashless)
        loop do
          base = @text.name
          name = if @text.chance(0.15) then "/global/#{base}"
          elsif slashless && @text.chance(0.2) then base.delete_prefix("/")
          else "/#{base}"
          end
          return name unless name.include?(Store::SITE_SEPARATOR) || name.empty? || name.bytesize > 200
        end
      end

      def channel = @text.pick(@channels)

      def site = @text.pick(@sites)

      def codec = @text.chance(0.5) ? :json : :msgpack

      def key(channel, site) = [channel, channel.start_with?(Bus::GLOBAL_PREFIX) ? nil : site]

      def publish
        ch = channel
        s = site
        c = codec
        k = key(ch, s)
        @published[k] += 1
        @total += 1
        {op: :publish, codec: c, channel: ch, site_id: s, data: data(c),
         user_ids: targets { @text.chance(0.5) ? @text.int(-5..10**12) : @text.name(3) },
         group_ids: targets { @text.chance(0.1) ? @text.pick(TARGET_EXTREMES) : @text.int(0..20) },
         client_ids: targets { @text.chance(0.5) ? @random.bytes(8).unpack1("H*") : @text.name(4) },
         max_backlog_size: size, max_backlog_age: extreme_age || age(k, first: @published[k] == 1)}
      end

      def data(codec)
        return @text.data(codec) unless @payload_limit < Store::Limits::MAX_PAYLOAD_BYTES && @text.chance(0.05)
        encoded_to(codec, @payload_limit + @text.int(-1..1))
      end

      # Data the codec encodes to exactly `bytes` bytes: a JSON string adds its quotes, MessagePack bin its header.
      def encoded_to(codec, bytes)
        return "x" * (bytes - 2) if codec == :json
        header = if bytes - 2 < 256
          2
        elsif bytes - 3 < 65_536
          3
        else
          5
        end
        @text.binary(bytes - header)
      end

      def size
        return @text.pick(SIZE_EXTREMES) if @text.chance(0.03)
        @text.chance(0.15) ? @text.int(1..40) : nil
      end

      def extreme_age = (!@forking && @text.chance(0.03)) ? @text.pick(AGE_EXTREMES) : nil

      def id_or_extreme(id) = @text.chance(0.05) ? @text.pick(ID_EXTREMES) : id

      def targets
        return nil unless @text.chance(0.12)
        Array.new(@text.int(1..3)) { yield }
      end

      # Mostly given at a key's first publish, then repeated; sometimes changed later (a changed age applies
      # to the messages published from then on).
      def age(key, first:)
        return nil if @forking
        if !first && @text.chance(0.95)
          return (@ages[key] && @text.chance(0.2)) ? @ages[key] : nil
        end
        return nil unless @text.chance(first ? 0.1 : 0.6)
        @ages[key] = @text.pick(@text.chance(0.3) ? SHORT_AGES : LONG_AGES)
      end

      def some_id(count) = @text.chance(0.4) ? 0 : @text.int(0..count + 1)

      def backlog
        ch = channel
        s = site
        {op: :backlog, codec: codec, channel: ch, site_id: s, last_id: id_or_extreme(some_id(@published[key(ch, s)]))}
      end

      def last_id = {op: :last_id, codec: codec, channel: channel, site_id: site}

      def last_ids = {op: :last_ids, codec: codec, channels: Array.new(@text.int(0..5)) { channel }, site_id: site}

      def global_backlog
        limit = @text.chance(0.4) ? @text.int(1..30) : nil
        limit = @text.pick(ID_EXTREMES) if @text.chance(0.04)
        {op: :global_backlog, codec: codec, last_id: id_or_extreme(some_id(@total)), limit: limit}
      end

      def subscribe
        ch = channel
        s = site
        from = @text.chance(0.3) ? nil : some_id(@published[key(ch, s)])
        @open << (@subscriptions += 1)
        {op: :subscribe, codec: codec, channel: ch, site_id: s, from: from, number: @subscriptions}
      end

      def finish = {op: :finish, number: @open.delete_at(@text.int(0...@open.size))}

      def reopen
        @open.clear # every subscription is finished first
        {op: :reopen}
      end

      # A forked child's publishes carry no retention: see Runner#fork.
      def fork
        @forking = true
        {op: :fork, publishes: Array.new(@text.int(1..4)) { publish.merge(max_backlog_size: nil, max_backlog_age: nil) }}
      ensure
        @forking = false
      end

      def sleep = {op: :sleep, seconds: @text.pick([0.05, 0.1, 0.2, 0.4])}

      # Another process wipes the store (a log directory emptied and recreated) and publishes into the new
      # one (no retention: see Runner#fork), while this one holds it open with readers (Runner#run_replace_dir).
      def replace_dir
        @open.clear # every subscription is finished first
        @forking = true
        {op: :replace_dir, publishes: Array.new(@text.int(0..4)) { publish.merge(max_backlog_size: nil, max_backlog_age: nil) }}
      ensure
        @forking = false
      end
    end
  end
end
