# frozen_string_literal: true

module Herald
  # A live reader on one channel (or on every channel when channel is nil), fed by the bus's dispatcher.
  # It remembers the last id it delivered, so catch-up from the backlog and live delivery never overlap.
  class Subscription
    attr_reader :channel, :site_id, :last_id

    def initialize(bus:, channel:, site_id:, last_id:, catch_up:, callback:)
      @bus = bus
      @channel = channel
      @site_id = site_id
      @last_id = last_id # message_id for a channel, global_id for all channels
      @catch_up = catch_up
      @callback = callback
      @active = true
    end

    def active? = @active

    def unsubscribe
      @active = false
      @bus.unsubscribe(self)
    end

    # What this subscription missed before it went live. Called once, on the dispatcher thread.
    def catch_up(store)
      return [] unless @catch_up
      @catch_up = false
      @channel ? store.backlog(@channel, @last_id, site_id: @site_id) : store.global_backlog(@last_id)
    end

    def deliver(msg)
      return unless @active && matches?(msg)
      id = @channel ? msg.message_id : msg.global_id
      return if id <= @last_id
      @last_id = id
      @callback.call(msg)
    end

    private

    def matches?(msg)
      return true if @channel.nil?
      msg.channel == @channel && msg.site_id == @site_id
    end
  end
end
