# frozen_string_literal: true

module Herald
  # The one tree of errors Herald raises. Rescue Herald::Error to catch them all.
  class Error < StandardError; end

  # Herald cannot run as it is set up: configured after the first publish, an empty HERALD_DIR, a port
  # in use, a Rails too old.
  class ConfigurationError < Error; end

  # An argument Herald does not accept, in a call or a constructor: a channel that is not a non-empty
  # String, an id beyond 64 bits, a timeout that is not a finite number of seconds, an unknown store URL,
  # codec or option. The message says what is accepted. One rule for the public API: every value of every
  # argument either works or raises a Herald::Error, this one or a subclass, never Ruby's ArgumentError
  # (Herald::Error is a class, so one error cannot be both: rescue Herald::Error, or this). Only a call
  # Ruby itself refuses, a wrong number of arguments or an unknown keyword, raises Ruby's own.
  class InvalidArgumentError < Error; end

  # A publish no store can take as given: refused before anything is stored, on every store. Data the
  # codec cannot carry, a channel or site id that is empty, not UTF-8 or over Store::MAX_CHANNEL_BYTES,
  # data over the store's `max_payload_bytes`, targets that are not Integers or Strings (or pack to more
  # than Store::MAX_TARGETS_BYTES), retention out of range, and what message_bus refuses too: empty target
  # lists, user/group targets on /global/.
  class InvalidMessageError < InvalidArgumentError; end

  # The store was closed and cannot be used any more.
  class ClosedError < Error; end

  # A network store (Redis, PostgreSQL) could not be reached.
  class ConnectionError < Error; end

  # A network store did not answer within its `timeout:` (a stalled server, a lock held elsewhere). A
  # publish that raises it may or may not have been stored, as with any ConnectionError.
  class TimeoutError < ConnectionError; end

  # Anything the store itself failed at.
  class StoreError < Error; end

  # A stored record failed its checksum. Never returned as data.
  class CorruptRecordError < StoreError
    attr_reader :segment, :offset

    def initialize(message = nil, segment: nil, offset: nil)
      @segment = segment
      @offset = offset
      super(message || "corrupt record in #{segment} at offset #{offset}")
    end
  end

  # A side file of the log store (META, STATE, IDS) is damaged and cannot be rebuilt from the segments.
  # Names the file; the message says what to do.
  class CorruptStoreError < StoreError
    attr_reader :file

    def initialize(message = nil, file: nil)
      @file = file
      super(message || "#{file} is damaged")
    end
  end

  # A deferred subscriber's saved cursor is damaged (empty, truncated, garbage, negative) and no good
  # earlier version is left. The subscriber stops rather than start over from the oldest retained event.
  class CorruptCursorError < StoreError
    attr_reader :name

    def initialize(message = nil, name: nil)
      @name = name
      super(message || "the cursor of #{name} is damaged")
    end
  end

  # The disk is full or a file-size limit was hit; what is stored stays readable.
  class StoreFullError < StoreError; end

  # The embedded log's directory was replaced (emptied and recreated, a backup restored) while a publish was
  # being written: nothing of it was stored. A lone publish is written again into the new directory; a
  # publish batched with others under `fsync: :always` raises this: publish again.
  class LogReplacedError < StoreError; end

  # The store's directory (or server) refuses writes; what is stored stays readable.
  class ReadOnlyError < StoreError; end

  # A Redis replica answered READONLY (a failover left the app pointed at a replica): write to the primary.
  class ReplicaReadOnlyError < ReadOnlyError; end

  # fsync failed: the store can no longer promise durability and refuses further writes.
  class DurabilityError < StoreError; end

  # An HTTP request the transport refuses (bad body, too many channels, bad ids). Carries the 4xx status
  # the middleware answers with; the message is short and safe to show to the client.
  class RequestError < Error
    attr_reader :status

    def initialize(message, status: 400)
      @status = status
      super(message)
    end
  end

  # An event names a class this process has not loaded: require the file defining it before workers start.
  class UnknownEventClassError < Error; end

  # An event the event codec cannot carry: publish a Struct, a Hash, or plain JSON-like values.
  class EventEncodingError < Error; end

  # A subscriber class is declared wrongly (no name, nothing subscribed to, an unknown option).
  class SubscriberError < ConfigurationError; end

  # Another process is doing the same operator action right now (retrying a subscriber's dead letters,
  # moving a cursor its worker still holds): try again in a moment.
  class BusyError < Error; end
end
