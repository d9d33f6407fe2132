# frozen_string_literal: true

module Herald
  module Store
    # The reference store: everything in this process's memory, thread-safe, gone at exit.
    # Every other store must behave like this one (test/store/contract.rb).
    class Memory
      include Controls

      attr_reader :epoch, :max_payload_bytes
      alias_method :known_epoch, :epoch

      # max_payload_bytes: the most data (as encoded) a message may carry; lower than the other stores'
      # Limits::MAX_PAYLOAD_BYTES only if you want to, never higher, so an app can move to any store.
      def initialize(max_backlog_size: DEFAULT_MAX_BACKLOG_SIZE, max_backlog_age: DEFAULT_MAX_BACKLOG_AGE,
        max_payload_bytes: Limits::MAX_PAYLOAD_BYTES)
        Limits.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidArgumentError)
        @max_payload_bytes = Limits.validate_max_payload!(max_payload_bytes)
        @max_backlog_size = max_backlog_size
        @max_backlog_age = max_backlog_age
        @lock = Monitor.new
        @appended = @lock.new_cond
        @epoch = Store.new_epoch
        @global_id = 0
        @global = [] # retained messages, oldest first
        @channels = {} # key => Channel
        @cursors = {}
        @leases = {}
        @retained = 0 # messages still in some channel's backlog
        @closed = false
        @watchers = Watchers.new
      end

      # ages: nil while the channel kept one max_age; else [[first message id, max_age], ...] ascending, so
      # each message keeps the age it was published with (a changed age applies from then on).
      Channel = Struct.new(:last_id, :messages, :max_size, :max_age, :ages)

      def append(channel, payload, codec:, created_at: nil, user_ids: nil, group_ids: nil, client_ids: nil,
        site_id: nil, max_backlog_size: nil, max_backlog_age: nil)
        Limits.validate_append!(channel, site_id, payload, @max_payload_bytes, created_at)
        Limits.validate_retention!(max_backlog_size, max_backlog_age) if max_backlog_size || max_backlog_age
        Limits.pack_targets(user_ids, group_ids, client_ids) if user_ids || group_ids || client_ids # what the others can keep
        msg = @lock.synchronize do
          raise ClosedError, "store is closed" if @closed
          ch = channel_for(Store.channel_key(channel, site_id))
          ch.max_size = max_backlog_size if max_backlog_size
          change_age(ch, max_backlog_age) if max_backlog_age && max_backlog_age != ch.max_age
          msg = Message.new(global_id: @global_id += 1, message_id: ch.last_id += 1, channel: channel,
            payload: payload, codec: codec, created_at: created_at&.to_f || Process.clock_gettime(Process::CLOCK_REALTIME),
            user_ids: user_ids, group_ids: group_ids, client_ids: client_ids, site_id: site_id)
          ch.messages << msg
          @global << msg
          @retained += 1
          trim(ch)
          @appended.broadcast
          msg
        end
        @watchers.call
        msg
      end

      def last_id(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        @lock.synchronize { @channels[Store.channel_key(channel, site_id)]&.last_id || 0 }
      end

      def last_ids(channels, site_id: nil)
        Limits.validate_keys!(channels, site_id)
        @lock.synchronize { channels.to_h { |c| [c, @channels[Store.channel_key(c, site_id)]&.last_id || 0] } }
      end

      def last_global_id = @lock.synchronize { @global_id }

      # The same without the lock, for Rack::ReplyCache's check on every poll: reading an Integer is atomic
      # under the GVL; an append in progress may not be seen yet, as for a poll that came a moment sooner.
      def peek_last_global_id = @global_id

      def local_reads? = true

      # Reads are local already: readers read global_backlog.
      def announced_backlog(_last_id, limit: nil) = nil

      def data_dir = nil # nothing on this machine's disk

      def bytes_on_disk = nil

      def backlog(channel, last_id = 0, site_id: nil)
        Limits.validate_key!(channel, site_id)
        Limits.validate_id!(:last_id, last_id)
        @lock.synchronize do
          ch = @channels[Store.channel_key(channel, site_id)] or return []
          # Messages are in id order: find the start by binary search, check age only on what is returned.
          i = ch.messages.bsearch_index { |m| m.message_id > last_id } or return []
          live(ch, ch.messages[i..])
        end
      end

      def global_backlog(last_id = 0, limit: nil)
        Limits.validate_id!(:last_id, last_id)
        Limits.validate_limit!(limit)
        @lock.synchronize do
          @global.reject! { |m| !retained?(m) } if @global.first && !retained?(@global.first)
          # @global is in id order: a binary search, not a scan (deferred subscribers read in batches).
          i = @global.bsearch_index { |m| m.global_id > last_id } or return []
          found = []
          while (m = @global[i]) && (limit.nil? || found.size < limit)
            found << m if retained?(m) # each by its own age: timestamps need not be in order
            i += 1
          end
          found
        end
      end

      def wait(last_global_id, timeout:)
        Limits.validate_wait!(last_global_id, timeout)
        deadline = monotonic + timeout
        @lock.synchronize do
          while @global_id <= last_global_id
            raise ClosedError, "store is closed" if @closed
            left = deadline - monotonic
            break if left <= 0
            @appended.wait(left)
          end
          @global_id
        end
      end

      # The block runs on the appending thread after every append (Store::Watchers): => a Watch (#cancel).
      def watch(&block) = @watchers.add(block)

      def load_cursor(name, default: 0) = @lock.synchronize { @cursors.fetch(name, default) }

      def save_cursor(name, global_id)
        Store.validate_cursor!(global_id)
        @lock.synchronize { @cursors[name] = global_id }
      end

      def lease(name)
        @lock.synchronize do
          return nil if @leases[name]
          @leases[name] = Store.lease_holder_id
          Lease.new { @lock.synchronize { @leases.delete(name) } }
        end
      end

      def lease_holder(name) = @lock.synchronize { @leases[name] }

      def retention(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        @lock.synchronize do
          ch = @channels[Store.channel_key(channel, site_id)]
          ch ? [ch.max_size, ch.max_age] : [@max_backlog_size, @max_backlog_age]
        end
      end

      def stats
        @lock.synchronize do
          {"kind" => "memory", "max_backlog_size" => @max_backlog_size, "max_backlog_age" => @max_backlog_age,
           "retained_messages" => @retained, "channels" => @channels.size}
        end
      end

      def close
        @lock.synchronize do
          @closed = true
          @appended.broadcast
        end
      end

      private

      def channel_for(key)
        @channels[key] ||= Channel.new(0, [], @max_backlog_size, @max_backlog_age)
      end

      # Drops the channel's oldest beyond its size; the global list is compacted lazily, in bulk.
      def trim(ch)
        while ch.messages.size > ch.max_size
          ch.messages.shift
          @retained -= 1
        end
        @global.select! { |m| retained?(m) } if @global.size > 2 * @retained + 64
      end

      def retained?(msg)
        ch = @channels[Store.channel_key(msg.channel, msg.site_id)]
        ch.messages.first.message_id <= msg.message_id && msg.created_at > Process.clock_gettime(Process::CLOCK_REALTIME) - age_of(ch, msg)
      end

      def change_age(ch, age)
        (ch.ages ||= [[0, ch.max_age]]) << [ch.last_id + 1, age]
        ch.max_age = age
      end

      # The messages still within their max_backlog_age. A channel that never changed its age compares with
      # one bound: an age looked up per message doubled the cost of a backlog(100).
      def live(ch, messages)
        now = Process.clock_gettime(Process::CLOCK_REALTIME)
        return messages.select { |m| m.created_at > now - age_of(ch, m) } if ch.ages
        oldest = now - ch.max_age
        messages.select { |m| m.created_at > oldest }
      end

      def age_of(ch, msg)
        return ch.max_age unless ch.ages
        ch.ages.reverse_each { |from, age| return age if msg.message_id >= from }
      end

      def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
