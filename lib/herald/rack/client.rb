# frozen_string_literal: true

module Herald
  module Rack
    # Who is polling and where it is in each channel. Small on purpose: thousands are parked at once.
    #
    # The client id (the URL segment) is a bearer token: whoever knows it receives the messages published
    # with `client_ids:` naming it. Clients make it random (32 hex digits); never put it in shared logs or URLs
    # that others see, and use user_ids/group_ids (from the session, via the lookups) for real access control.
    class Client
      GLOBAL_PREFIX = "/global/"

      attr_reader :id, :user_id, :group_ids, :site_id, :seq, :positions

      # positions: {channel => last message id the client has}, updated as messages are sent.
      def initialize(id:, user_id:, group_ids:, site_id:, seq:, positions:)
        @id = id
        @user_id = user_id
        @group_ids = group_ids
        @site_id = site_id
        @seq = seq
        @positions = positions
      end

      # The keys the event loop indexes this client under: the store's channel keys (site-scoped except
      # for /global/ channels), so a message's (channel, site_id) finds exactly its readers.
      def keys
        @keys ||= @positions.keys.map { |channel| Client.key(channel, @site_id) }
      end

      def self.key(channel, site_id)
        (site_id.nil? || channel.start_with?(GLOBAL_PREFIX)) ? channel : Store.channel_key(channel, site_id)
      end

      # message_bus's Client#allowed? (docs/protocol.md 1.8): client_ids AND (user_ids OR group_ids), then the
      # client message filters of matching prefixes, last registered first.
      def allowed?(msg, filters)
        client_ids = msg.client_ids
        return false if client_ids && !client_ids.empty? && !client_ids.include?(@id)
        user_ids = msg.user_ids
        group_ids = msg.group_ids
        return false if (user_ids || group_ids) && !(user_ids&.include?(@user_id) || in_group?(group_ids))
        filters.empty? || filters_allow?(msg, filters)
      end

      private

      def in_group?(group_ids) = !group_ids.nil? && !@group_ids.nil? && group_ids.intersect?(@group_ids)

      def filters_allow?(msg, filters)
        filters.reverse_each do |prefix, filter|
          next unless msg.channel.start_with?(prefix)
          return false unless filter.call(msg)
        end
        true
      end
    end
  end
end
