# frozen_string_literal: true

module Herald
  # A live reader on one channel (or on every channel when channel is nil), fed by the bus's dispatcher.
  # It remembers the last id it delivered, so catch-up from the backlog and live delivery never overlap.
  #
  # A channel subscription without a site id sees the channel from every site, as message_bus's
  # `subscribe` does (`msg.site_id` says which). Message ids are counted per channel and site, so it
  # follows global ids; the last_id it is given is a message id of the site-less channel, whose backlog
  # it replays first (message_bus replays that one too). With a site id it sees that site only.
  class Subscription
    attr_reader :channel, :site_id, :last_id

    def initialize(bus:, channel:, site_id:, last_id:, catch_up:, callback:, global_floor: nil)
      @bus = bus
      @channel = channel
      @site_id = site_id
      @last_id = last_id # message_id for a channel on one site, global_id otherwise
      @every_site = channel && site_id.nil?
      @global = global_floor # the global id a subscription on every site delivers after
      @catch_up = catch_up
      @callback = callback
      @active = true
      @counted = true # in herald_messages_delivered_total{transport="subscriber"}
    end

    def active? = @active

    # A subscription that feeds another reader (the reactor's, on a networked store) whose deliveries are
    # counted where they end up: not a subscriber's.
    def uncounted! = @counted = false

    def unsubscribe
      @active = false
      @bus.unsubscribe(self)
    end

    # What this subscription missed before it went live. Called once, on the dispatcher thread.
    def catch_up(store)
      return [] unless @catch_up
      missed = read_missed(store)
      @catch_up = false # only once the read succeeded: a failed one is tried again
      missed
    end

    private def read_missed(store)
      return store.global_backlog(@last_id) unless @channel
      return store.backlog(@channel, @last_id, site_id: @site_id) unless @every_site
      every_site_catch_up(store)
    end

    # The store was reset (a new epoch, ids started over): what it holds now is new to this subscription.
    # On the dispatcher thread.
    def restart
      @last_id = 0 if @last_id
      @global = 0 if @global
      @catch_up = false
    end

    def deliver(msg)
      return unless @active && matches?(msg)
      if @every_site
        return unless every_site_new?(msg)
      else
        id = @channel ? msg.message_id : msg.global_id
        return if id <= @last_id
        @last_id = id
      end
      Metrics::DELIVERED.add(1, Metrics::SUBSCRIBER) if @counted
      @callback.call(msg)
    end

    private

    def matches?(msg)
      return true if @channel.nil?
      msg.channel == @channel && (@every_site || msg.site_id == @site_id)
    end

    # Past the global id seen at subscribe time, or (the replay) a site-less message past last_id.
    def every_site_new?(msg)
      replayed = @last_id && msg.site_id.nil? && msg.message_id > @last_id
      return false unless msg.global_id > @global || replayed
      @global = msg.global_id if msg.global_id > @global
      @last_id = msg.message_id if replayed
      true
    end

    # The site-less backlog after last_id (read first), then everything on the channel after the global id
    # seen at subscribe time, from every site (read second, so nothing appended in between is missed).
    def every_site_catch_up(store)
      replay = @last_id ? store.backlog(@channel, @last_id) : []
      floor = @global
      since = []
      loop do
        batch = store.global_backlog(floor, limit: Bus::BATCH)
        break if batch.empty?
        batch.each { |m| since << m if m.channel == @channel }
        floor = batch.last.global_id
      end
      replay.select! { |m| m.global_id <= @global }
      replay.concat(since)
    end
  end
end
