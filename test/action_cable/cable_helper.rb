# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
# What a Rails app has loaded before ActionCable picks its adapter (the lookup camelizes "herald").
require "active_support"
require "active_support/core_ext/string/inflections"
require "active_support/core_ext/hash/indifferent_access"
require "action_cable"
require "concurrent"
require "action_cable/subscription_adapter/herald"

module Herald
  # For the ActionCable tests: servers configured for `adapter: herald` on each store, and every adapter
  # built during a test shut down after it (Rails' suite leaves its second server's adapters running).
  module CableTestSupport
    STORES = %i[log redis postgres].freeze

    module Tracked
      def self.adapters = (@adapters ||= [])

      def initialize(...)
        super
        Tracked.adapters << self
      end
    end
    ActionCable::SubscriptionAdapter::Herald.prepend(Tracked)

    # The `store:` of cable.yml for a kind of store (a fresh log directory per test).
    def store_setting(kind)
      case kind
      when :log then (@cable_dir ||= Dir.mktmpdir("herald-cable"))
      when :redis then TestServers.require!(self, :redis)
      when :postgres then TestServers.require!(self, :postgres)
      end
    end

    def cable_server(**cable)
      ActionCable::Server::Base.new.tap do |server|
        server.config.cable = {adapter: "herald", **cable}.with_indifferent_access
        server.config.logger = Logger.new(IO::NULL)
      end
    end

    def shut_down_adapters
      Tracked.adapters.each(&:shutdown)
      Tracked.adapters.clear
      FileUtils.rm_rf(@cable_dir) if @cable_dir
      @cable_dir = nil
    end

    # Subscribes and waits for ActionCable's success callback; returns the Queue the broadcasts land in.
    def subscribed_queue(adapter, channel, timeout: 5)
      queue = Queue.new
      confirmed = Queue.new
      adapter.subscribe(channel, ->(payload) { queue << payload }, -> { confirmed << true })
      Timeout.timeout(timeout, nil, "subscription to #{channel} never confirmed") { confirmed.pop }
      queue
    end

    def pop(queue, timeout: 10) = Timeout.timeout(timeout, nil, "no broadcast within #{timeout} s") { queue.pop }
  end
end
