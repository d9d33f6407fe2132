# frozen_string_literal: true

require "digest"

module Herald
  # Where ActionCable's broadcastings live in a Herald store (`adapter: herald` in config/cable.yml, see
  # lib/action_cable/subscription_adapter/herald.rb): one Herald channel per broadcasting, under a prefix of
  # their own, so they never mix with message_bus channels (`/chat`) or events (`/events/...`). The HTTP
  # transport refuses to serve them: a broadcasting is for the clients ActionCable's channels authorized.
  #
  # A broadcasting's messages have ids like any channel's (message_id from 1, per broadcasting), and the
  # store has an epoch: together they say where a reader of one broadcasting is.
  module Cable
    PREFIX = "/herald/cable/"
    # A broadcasting whose name cannot be a channel's (over Store::MAX_CHANNEL_BYTES with the prefix, not
    # UTF-8, or holding the site separator) is named by its SHA-256, as ActionCable's PostgreSQL adapter
    # does for long names.
    DIGEST = "#{PREFIX}#sha256:"
    # Broadcasts are for subscribers listening now: kept briefly, long enough for a burst to be read.
    DEFAULT_MAX_BACKLOG_SIZE = 1000 # per broadcasting
    DEFAULT_MAX_BACKLOG_AGE = 60 # seconds

    # The Herald channel of an ActionCable broadcasting (a String; Symbols are named by their text).
    def self.channel(broadcasting)
      name = broadcasting.to_s
      name = name.dup.force_encoding(Encoding::UTF_8) unless name.encoding == Encoding::UTF_8
      return "#{PREFIX}#{name}" if plain?(name)
      "#{DIGEST}#{Digest::SHA256.hexdigest(name.b)}"
    end

    # True for the channels of broadcastings (what the HTTP transport refuses, what the adapter reads).
    def self.channel?(channel) = channel.start_with?(PREFIX)

    def self.plain?(name)
      name.valid_encoding? && !name.start_with?("#sha256:") && !name.include?(Store::SITE_SEPARATOR) &&
        PREFIX.bytesize + name.bytesize <= Store::MAX_CHANNEL_BYTES
    end
    private_class_method :plain?
  end
end
