# frozen_string_literal: true

require "msgpack"

module Herald
  module Store
    # What every store accepts, the same on all four: the ranges of retention, ids, timeouts, targets and
    # data, and the checks that refuse anything else with a Herald::Error saying what is accepted (never a
    # value that wraps, is cut, or is acknowledged and then lost). Stores call them in their public methods.
    module Limits
      # The most data one message carries, as its codec encoded it, on every store (a store's own
      # `max_payload_bytes:` may be lower): a Log record, with its header, channel, site id and targets, is
      # read back only up to 256 MiB (Log::Record::MAX_PAYLOAD); Redis strings end at 512 MB, PostgreSQL
      # values at 1 GB. Bigger data is refused at publish, never acknowledged and then lost.
      MAX_PAYLOAD_BYTES = 240 * 1024 * 1024
      # The most user_ids, group_ids and client_ids take together, packed (about a million Integer ids).
      MAX_TARGETS_BYTES = 8 * 1024 * 1024
      # Retention every store keeps as given: the Log's records carry max_backlog_size in 32 bits.
      MAX_BACKLOG_SIZE = 2**32 - 1
      MAX_BACKLOG_AGE = 100 * 365 * 24 * 60 * 60 # seconds: 100 years
      MAX_TIMEOUT = 365 * 24 * 60 * 60 # seconds: a year
      MIN_TARGET = -2**63 # an Integer target is what MessagePack carries
      MAX_TARGET = 2**64 - 1
      EMPTY = "".b.freeze

      # Retention given to a publish (InvalidMessageError) or a store (InvalidArgumentError): what every store
      # can keep as given (the Log's records carry the size in 32 bits; Redis takes expiries in integer ms).
      def self.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidMessageError)
        if max_backlog_size && !(max_backlog_size.is_a?(Integer) && max_backlog_size >= 1 && max_backlog_size <= MAX_BACKLOG_SIZE)
          raise error, "max_backlog_size must be an Integer from 1 to #{MAX_BACKLOG_SIZE} (messages kept per channel), got #{shown(max_backlog_size)}"
        end
        return unless max_backlog_age && !(max_backlog_age.is_a?(Numeric) && max_backlog_age.real? && max_backlog_age > 0 && max_backlog_age <= MAX_BACKLOG_AGE)
        raise error, "max_backlog_age must be a number of seconds above 0 and at most #{MAX_BACKLOG_AGE} (100 years), got #{shown(max_backlog_age)}"
      end

      # A message id or global id given to a read (last_id, a subscription's start): within 64 bits, what every
      # store counts in; 0 or less reads from the oldest retained message.
      def self.validate_id!(name, id)
        return if id.is_a?(Integer) && id.bit_length < 64
        raise InvalidArgumentError, "#{name} must be an Integer from -2**63 to 2**63-1 (an id; 0 reads from the oldest), got #{shown(id)}"
      end

      # global_backlog's limit: nil (no limit) or a positive Integer within 64 bits.
      def self.validate_limit!(limit)
        return if limit.nil? || (limit.is_a?(Integer) && limit >= 1 && limit.bit_length < 64)
        raise InvalidArgumentError, "limit must be nil or an Integer from 1 to 2**63-1, got #{shown(limit)}"
      end

      # A wait's or a connection's timeout: a finite number of seconds up to MAX_TIMEOUT (Ruby's own waits
      # refuse times beyond their clocks' range); 0 only where it means "do not wait".
      def self.validate_seconds!(name, value, zero: false, error: InvalidArgumentError)
        if value.is_a?(Numeric) && value.real? && (zero ? value >= 0 : value > 0) && value <= MAX_TIMEOUT
          return
        end
        raise error, "#{name} must be a number of seconds #{zero ? "from 0" : "above 0"} up to #{MAX_TIMEOUT}, got #{shown(value)}"
      end

      # What a store's append is given, checked before anything is stored: channel a String, site id nil or
      # a String, the data the codec's String within the store's max_payload_bytes, created_at nil or a
      # finite number of seconds. The Bus has checked the names further (sizes); this is what a store
      # needs to keep, and give back, what it acknowledges.
      def self.validate_append!(channel, site_id, payload, limit, created_at)
        return if text?(channel) && (site_id.nil? || text?(site_id)) && payload.is_a?(String) &&
          payload.bytesize <= limit && (created_at.nil? || created_at.is_a?(Float) && created_at.finite?)
        validate_key!(channel, site_id, InvalidMessageError)
        validate_payload!(payload, limit)
        return if created_at.nil? || (created_at.is_a?(Numeric) && created_at.real? && created_at.finite?)
        raise InvalidMessageError, "created_at must be nil or a finite number of seconds since the epoch, got #{shown(created_at)}"
      end

      # A channel and site id handed to a store: its keys are made of them, read back as UTF-8 (PostgreSQL
      # keeps them as text, which refused other bytes with a StoreError).
      def self.validate_key!(channel, site_id, error = InvalidArgumentError)
        raise error, "channel must be a UTF-8 String, got #{shown(channel)}" unless text?(channel)
        return if site_id.nil? || text?(site_id)
        raise error, "a store's site_id is nil or a UTF-8 String, got #{shown(site_id)}"
      end

      # UTF-8 text, or ASCII in any encoding (Rack's binary env strings, Integer#to_s): both checks read the
      # String's cached code range, so a name checked once costs nothing more.
      def self.text?(value)
        value.is_a?(String) && value.valid_encoding? && (value.encoding == Encoding::UTF_8 || value.ascii_only?)
      end

      def self.validate_keys!(channels, site_id)
        raise InvalidArgumentError, "channels must be an Array of Strings, got #{shown(channels)}" unless channels.is_a?(Array)
        channels.each { |channel| validate_key!(channel, site_id) }
      end

      # Store#wait's arguments: a global id, and how long to wait (0: not at all).
      def self.validate_wait!(last_global_id, timeout)
        validate_id!(:last_global_id, last_global_id)
        validate_seconds!(:timeout, timeout, zero: true)
      end

      # The data a store is given, as encoded: a String of at most `limit` bytes (the store's max_payload_bytes).
      def self.validate_payload!(payload, limit)
        raise InvalidMessageError, "a message's payload is the codec's String, got #{payload.class}" unless payload.is_a?(String)
        return if payload.bytesize <= limit
        raise InvalidMessageError, "the message's data is #{payload.bytesize} bytes as encoded, over the #{limit} " \
          "this store takes (max_payload_bytes; #{MAX_PAYLOAD_BYTES} at most on every store): publish a reference to it instead"
      end

      # A store's `max_payload_bytes:` option: lower than MAX_PAYLOAD_BYTES if you like, never higher.
      def self.validate_max_payload!(bytes)
        return bytes if bytes.is_a?(Integer) && bytes >= 1 && bytes <= MAX_PAYLOAD_BYTES
        raise InvalidArgumentError, "max_payload_bytes must be an Integer from 1 to #{MAX_PAYLOAD_BYTES}, got #{shown(bytes)}"
      end

      # user_ids, group_ids and client_ids as every store keeps them: MessagePack [user_ids, group_ids,
      # client_ids], checked first (Integers within what MessagePack carries, or Strings; at most
      # MAX_TARGETS_BYTES in all). EMPTY when there are none.
      def self.pack_targets(user_ids, group_ids, client_ids)
        return EMPTY unless user_ids || group_ids || client_ids
        validate_targets!(:user_ids, user_ids) if user_ids
        validate_targets!(:group_ids, group_ids) if group_ids
        validate_targets!(:client_ids, client_ids) if client_ids
        packed = MessagePack.pack([user_ids, group_ids, client_ids])
        return packed if packed.bytesize <= MAX_TARGETS_BYTES
        raise InvalidMessageError, "user_ids, group_ids and client_ids take #{packed.bytesize} bytes, over the " \
          "#{MAX_TARGETS_BYTES} every store accepts: target a group instead of its members"
      end

      def self.validate_targets!(name, ids)
        raise InvalidMessageError, "#{name} must be a non-empty Array or nil, got #{shown(ids)}" unless ids.is_a?(Array) && !ids.empty?
        # [current_user&.id] for a visitor: a nil target would match every anonymous client.
        raise InvalidMessageError, "#{name} must not contain nil, got #{shown(ids)}" if ids.include?(nil)
        ids.each do |id|
          next if id.is_a?(String) || (id.is_a?(Integer) && id >= MIN_TARGET && id <= MAX_TARGET)
          raise InvalidMessageError, "#{name} must hold Strings and Integers from -2**63 to 2**64-1, got #{shown(id)}"
        end
      end

      # A value in an error message: never a whole huge Array or String.
      def self.shown(value)
        text = value.inspect
        (text.size > 80) ? "#{text[0, 80]}... (#{value.class})" : text
      end
    end
  end
end
