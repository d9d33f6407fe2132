# frozen_string_literal: true

module Herald
  # One published message, as every reader sees it. Immutable: readers only.
  #
  # `payload` holds the bytes the codec produced at publish; `data` decodes them on first access,
  # so readers that only forward bytes (the HTTP transport, other processes) never build Ruby objects.
  class Message
    attr_reader :global_id, :message_id, :channel, :payload, :codec,
      :user_ids, :group_ids, :client_ids, :site_id, :created_at

    # created_at: Float seconds since the epoch (the store's clock at append).
    def initialize(global_id:, message_id:, channel:, payload:, codec:, created_at:,
      user_ids: nil, group_ids: nil, client_ids: nil, site_id: nil)
      assign(global_id, message_id, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
    end

    # What a store's append returns, built with positional arguments: ten keyword arguments cost
    # about a microsecond, and this is on every publish (the log calls Built.new itself).
    def self.build(global_id, message_id, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
      Built.new(global_id, message_id, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
    end

    # Readers below go through the accessors: messages read lazily from a record override them.
    def data
      return @data if defined?(@data)
      @data = codec.decode(payload)
    end

    # True when the message is meant for everyone (no user, group or client targets).
    def public?
      @user_ids.nil? && @group_ids.nil? && @client_ids.nil?
    end

    def targets
      {user_ids: user_ids, group_ids: group_ids, client_ids: client_ids, site_id: site_id}
    end

    def ==(other)
      other.is_a?(Message) && other.global_id == global_id && other.channel == channel &&
        other.message_id == message_id && other.payload == payload
    end
    alias_method :eql?, :==

    def hash = global_id.hash

    # For messages read lazily out of a store's record: the three target lists come from one unpack,
    # on first access. The including class defines `unpacked_targets` => [user_ids, group_ids, client_ids].
    module LazyTargets
      def user_ids = unpacked_targets[0]

      def group_ids = unpacked_targets[1]

      def client_ids = unpacked_targets[2]

      def public? = unpacked_targets.none?
    end

    def inspect
      "#<Herald::Message #{channel} global_id=#{global_id} message_id=#{message_id}>"
    end

    private

    def assign(global_id, message_id, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
      @global_id = global_id
      @message_id = message_id
      @channel = channel
      @payload = payload
      @codec = codec
      @created_at = created_at
      @user_ids = user_ids
      @group_ids = group_ids
      @client_ids = client_ids
      @site_id = site_id
      self
    end

    # A message built with positional arguments: `new` runs `assign` as its initializer (`allocate`
    # plus a `__send__` of ten arguments cost 700 instructions more, on every publish).
    class Built < Message
      alias_method :initialize, :assign
    end
  end
end
