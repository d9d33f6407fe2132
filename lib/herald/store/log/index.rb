# frozen_string_literal: true

module Herald
  module Store
    class Log
      # What one process knows of the log, in memory: every channel's last id, its retained messages
      # (the backlog) and retention, the retained messages in global order, and how many retained
      # messages each segment still holds (a segment with none left can be deleted).
      # Not thread-safe: the store calls it under its lock.
      class Index
        # ages: nil while the retained messages share max_age; else [[first message id, max_age], ...]
        # ascending: each message keeps the age it was published with (a changed age applies from then on).
        # record: what Log#append keeps of its records' constant bytes ([codec id, max size, max age, head, tail]).
        Channel = Struct.new(:last_id, :messages, :max_size, :max_age, :stepped_back, :ages, :record)
        COMPACT_SLACK = 4096 # dropped messages the global list may hold beyond 3x the retained ones

        attr_reader :last_global_id, :channels, :last_added

        def initialize(max_size:, max_age:)
          @max_size = max_size
          @max_age = max_age
          @channels = {}
          @global = [] # messages in global id order; dropped ones are compacted away in bulk
          @retained = 0
          @last_global_id = 0
          @last_added = 0 # global id of the last message added (a snapshot's floor does not count)
          @bases = [] # first global id of every segment, ascending
        end

        def add_segment(first_id)
          @bases << first_id
          @last_global_id = first_id - 1 if first_id - 1 > @last_global_id
        end

        def remove_segment(first_id)
          @bases.delete(first_id)
        end

        # The segments (first ids => true) that still hold a retained message. Asked only when a segment is
        # full (Log#retire), so add and drop keep no count per segment (two hash updates and a search on
        # every publish, a tenth of Index#add): each channel's messages are in global id order, so it takes
        # one search per segment they span.
        def live_segments
          live = {}
          @channels.each_value do |ch|
            msgs = ch.messages
            i = 0
            while (m = msgs[i])
              k = (@bases.bsearch_index { |b| b > m.global_id } || @bases.size) - 1
              live[@bases[k]] = true
              following = @bases[k + 1] or break
              i = msgs.bsearch_index { |x| x.global_id >= following } or break
            end
          end
          live
        end

        # Ids above `id` only from now on (records may have been lost, Reservation).
        def raise_floor(id)
          @last_global_id = id if id > @last_global_id
        end

        # Floors from a snapshot taken before old segments were deleted: ids never go back.
        def restore(state)
          @last_global_id = state.fetch("last_global_id", 0) if state.fetch("last_global_id", 0) > @last_global_id
          state.fetch("channels", {}).each do |key, (last_id, max_size, max_age)|
            ch = channel(key)
            ch.last_id = last_id if last_id > ch.last_id
            ch.max_size = max_size if max_size
            ch.max_age = max_age if max_age
          end
        end

        def snapshot
          {"last_global_id" => @last_global_id,
           "channels" => @channels.transform_values { |c| [c.last_id, c.max_size, c.max_age] }}
        end

        def channel(key) = @channels[key] ||= Channel.new(0, [], @max_size, @max_age)

        def last_id(key) = @channels[key]&.last_id || 0

        # A message read from (or just written to) the log, in global id order.
        def add(msg, key, retention = nil) = add_to(channel(key), msg, retention)

        # The same, for the channel's entry (Log#append looked it up already).
        def add_to(ch, msg, retention)
          # A record without retention was published with the defaults (a channel's other retention is
          # written into each of its records), whatever a snapshot restored for the channel since.
          if retention
            max_size = ch.max_size = retention[0] || ch.max_size
            age = retention[1] || ch.max_age
          else
            max_size = ch.max_size = @max_size
            age = @max_age
          end
          id = msg.message_id
          change_age(ch, age, id) if age != ch.max_age
          ch.last_id = id if id > ch.last_id
          messages = ch.messages
          # Timestamps out of order (the clock went backwards): expiry is no longer a prefix of the backlog.
          ch.stepped_back = true if (last = messages.last) && msg.created_at < last.created_at
          gid = msg.global_id
          @last_global_id = gid if gid > @last_global_id
          @last_added = gid
          messages << msg
          @global << msg
          @retained += 1
          while messages.size > max_size
            messages.shift
            @retained -= 1
          end
          # Here, not only when the global backlog is read: a process nobody reads it in (a web worker that
          # publishes or serves channel backlogs, with no subscriber) kept every message it ever saw.
          drop_dropped if @global.size > 4 * @retained + COMPACT_SLACK
        end

        def backlog(key, last_id)
          ch = @channels[key] or return []
          expire(ch, now)
          msgs = ch.messages
          i = msgs.bsearch_index { |m| m.message_id > last_id } or return []
          found = msgs[i, msgs.size - i]
          return found unless ch.stepped_back || ch.ages
          at = now
          found.select { |m| m.created_at > at - age_of(ch, m) }
        end

        def global_backlog(last_id, limit)
          compact if @global.size > 2 * @retained + 64
          i = @global.bsearch_index { |m| m.global_id > last_id } or return []
          found = []
          cutoff = now
          while (m = @global[i]) && (limit.nil? || found.size < limit)
            found << m if retained?(m, cutoff)
            i += 1
          end
          found
        end

        # Drops every channel's messages older than its max age (the rest expire lazily on read).
        def expire_all
          cutoff = now
          @channels.each_value { |ch| expire(ch, cutoff) }
        end

        private

        def expire(ch, at)
          drop(ch.messages.shift) while (m = ch.messages.first) && m.created_at <= at - age_of(ch, m)
          return unless ch.ages
          first = ch.messages.first
          ch.ages.shift while ch.ages.size > 1 && (first.nil? || ch.ages[1][0] <= first.message_id)
          ch.ages = nil if ch.ages.size == 1
        end

        def change_age(ch, age, from)
          if ch.messages.empty?
            ch.ages = nil
          else
            (ch.ages ||= [[0, ch.max_age]]) << [from, age]
          end
          ch.max_age = age
        end

        def age_of(ch, msg)
          return ch.max_age unless ch.ages
          ch.ages.reverse_each { |from, age| return age if msg.message_id >= from }
        end

        def drop(_msg)
          @retained -= 1
        end

        def retained?(msg, at)
          ch = @channels[Store.channel_key(msg.channel, msg.site_id)]
          first = ch.messages.first
          first && first.message_id <= msg.message_id && msg.created_at > at - age_of(ch, msg)
        end

        # The global list without the messages their channels dropped (trimmed, expired): a channel drops
        # from the front of its list, so its messages below its first one are gone. Cheaper than `compact`
        # (no age, and one channel lookup for a run of messages of one channel), so add can afford it.
        def drop_dropped
          name = site = ch = nil
          @global.select! do |m|
            unless m.channel.equal?(name) && m.site_id.equal?(site)
              name = m.channel
              site = m.site_id
              ch = @channels[Store.channel_key(name, site)]
            end
            (first = ch&.messages&.first) && first.message_id <= m.message_id
          end
        end

        def compact
          cutoff = now
          @global.select! { |m| retained?(m, cutoff) }
        end

        def now = Process.clock_gettime(Process::CLOCK_REALTIME)
      end
    end
  end
end
