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
    end

    def data
      return @data if defined?(@data)
      @data = @codec.decode(@payload)
    end

    # True when the message is meant for everyone (no user, group or client targets).
    def public?
      @user_ids.nil? && @group_ids.nil? && @client_ids.nil?
    end

    def targets
      {user_ids: @user_ids, group_ids: @group_ids, client_ids: @client_ids, site_id: @site_id}
    end

    def ==(other)
      other.is_a?(Message) && other.global_id == global_id && other.channel == channel &&
        other.message_id == message_id && other.payload == payload
    end
    alias_method :eql?, :==

    def hash = global_id.hash

    def inspect
      "#<Herald::Message #{channel} global_id=#{global_id} message_id=#{message_id}>"
    end
  end
end
