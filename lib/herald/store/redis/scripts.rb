# frozen_string_literal: true

require "digest/sha1"

module Herald
  module Store
    class Redis
      # The server-side scripts. Each runs atomically, so ids are assigned, stored, trimmed and announced
      # in one step. Keys: meta (hash: epoch, gid, floor), ids (hash: channel key => last message id),
      # each channel's sorted set (score message id, member the record: Store::Packed) and the global set
      # of references (score global id, member the record's message id as 8 bytes followed by the
      # channel set's key). A record is stored once, in its channel's set; the global set only points at
      # it, so trimming a channel removes its references too and an expired channel leaves references to
      # nothing, which global reads skip (and the global trim drops).
      #
      # Schema 2. Schema 1 (Herald before the global references) kept a second copy of every record in
      # `<namespace>:global`; schema 2 keeps its references in `<namespace>:refs` (Redis::GLOBAL_KEY) and
      # leaves the old set alone: channel backlogs read across the change, the global backlog starts at it.
      module Scripts
        Script = Struct.new(:source, :sha)
        # The largest record tail (Packed.tail: data and ~30 bytes) a wakeup carries. Every process listening
        # on the namespace receives every wakeup, so big records are read only by those that want them.
        ANNOUNCE_MAX = 16 * 1024

        def self.script(source) = Script.new(source.freeze, Digest::SHA1.hexdigest(source).freeze)

        # A reset (FLUSHALL, a restart without persistence, a failover to a replica that lost writes,
        # an old snapshot) shows as a missing epoch or a global id below what the caller has seen. Ids then
        # restart from a floor above anything handed out before: the caller's watermark or the wall clock
        # in 2**20 ids per second, whichever is higher. Channel ids restart above the floor too, so no
        # reader stalls behind its old last id and no old id is reused.
        # Every process hears of a reset from the keyless wakeup (a global id alone), on which it drops
        # every cached backlog.
        RESET = <<~LUA
          local function recover(gid, floor, watermark, clock, epoch, wake)
            floor = math.max(gid, watermark, clock)
            redis.call('HSET', KEYS[1], 'epoch', epoch, 'gid', floor, 'floor', floor)
            redis.call('PUBLISH', wake, string.format('%d', floor))
            return floor
          end
        LUA

        # KEYS meta ids refs channel_1 .. channel_n (the sets of the n records, repeated when shared).
        # ARGV known_epoch numbers wake_channel, then each record's tail. `numbers` is
        # struct.pack('>ddd', watermark, clock, max_global), then each record's retention
        # struct.pack('>dddd', max_size, ttl_ms, slack, trim_first), then the epoch to give the store if it
        # needs one: in the server, every argument costs about as much as a small command (~1,100
        # instructions) and every tonumber() ~1,700 (strtod), so the numbers travel packed, as doubles (exact
        # up to 2**53, like the ids in the records), and what is rarely needed rides with what is always
        # sent. A channel's key is not sent either: its set is `<namespace>:ch:<key>` and meta
        # `<namespace>:meta`, so the key starts where meta's length ends (Redis#channel_key). The other
        # way round, every Lua number handed to redis.call is printed with "%.17g" (~2,000 instructions):
        # the ids go to ZADD, HINCRBY and PUBLISH as strings printed once with '%d' (~700), the constant
        # increment as '1' (1 thread: 108.6k -> 100.8k server instructions a publish).
        # Returns {first_global_id, message_id_1 .. message_id_n}, followed by {epoch, reset} only when the
        # epoch is not the caller's or the store was reset: the records get consecutive global ids in the
        # order given.
        # The server's work is per call and per channel, not per record: one HINCRBY per channel hands out
        # its ids, one ZADD per channel stores its records, one ZADD stores every reference, one PUBLISH
        # per channel, and a PTTL per channel only when the caller asks for it: a negative ttl_ms says the
        # caller checked the set lately and it outlives this record. A check keeps the set at least
        # ttl + margin/2 ahead (margin: ttl/16, at most a minute) by pushing it ttl + margin ahead, so the
        # PEXPIRE is rarely needed and a caller asks again only after margin/2. After a reset, or when
        # the epoch is not the caller's (another process recovered: the sets the caller checked may be
        # gone), every set is checked.
        # A channel is trimmed by message id (ids are dense within a run: no ZCARD), in batches: once every
        # slack + 1 records it drops what is `max_size` or more ids behind, so it holds at most
        # max_size + slack records; backlogs read newest-first with LIMIT max_size, so they stay exact.
        # trim_first > 0 (the channel's size grows from it): the batch's leftovers go first. Trims run after
        # the adds: each drops ids below the record that asked for it, so the result is the same. The global
        # references are trimmed by global id the same way, every max_global / 16 ids.
        APPEND = script(RESET + <<~LUA)
          local refs = KEYS[3]
          -- A trim removes the trimmed records' references too, without reading the records back (that
          -- was a tenth of the server's work per publish): a channel's ids are dense, so the references are
          -- those of ids lowest..upto. When the count says the ids jumped (a reset), the references are
          -- left: global reads skip them (as they skip those of expired channels), the global trim drops them.
          local function trim(set, upto, newest)
            local lowest = redis.call('ZRANGE', set, '0', '0', 'WITHSCORES')[2]
            if not lowest then return end
            lowest = tonumber(lowest)
            -- Ids that jumped (a reset's floor: the new store's first records sit far below the next ones)
            -- are not dense: by id, the first records would go as if the jump were records. Trimmed by count
            -- then, keeping as many as by id (their references go with the global trim).
            if redis.call('ZCARD', set) < newest - lowest + 1 then
              redis.call('ZREMRANGEBYRANK', set, '0', string.format('%d', -(newest - upto) - 1))
              return
            end
            local removed = redis.call('ZREMRANGEBYSCORE', set, '-inf', string.format('%d', upto))
            if removed == 0 or removed ~= upto - lowest + 1 then return end
            local old = {}
            for mid = lowest, upto do old[#old + 1] = struct.pack('>d', mid) .. set end
            for i = 1, #old, 1000 do
              redis.call('ZREM', refs, unpack(old, i, math.min(i + 999, #old)))
            end
          end
          local n = #KEYS - 3
          local at = #KEYS[1] -- where a channel's key starts in its set's name
          -- The global ids: one HINCRBY (the previous id is what the reset checks compare); a reset
          -- overwrites it. `floor` is only there after a reset.
          local st = redis.call('HMGET', KEYS[1], 'epoch', 'floor')
          local gid = redis.call('HINCRBY', KEYS[1], 'gid', (n == 1) and '1' or string.format('%d', n)) - n
          local epoch, floor, reset = st[1], st[2] and tonumber(st[2]) or 0, 0
          local watermark, clock, max_global = struct.unpack('>ddd', ARGV[2])
          if (not epoch and ARGV[1] ~= '') or gid < watermark then
            epoch = string.sub(ARGV[2], 25 + 32 * n)
            floor = recover(gid, floor, watermark, clock, epoch, ARGV[3])
            redis.call('HSET', KEYS[1], 'gid', floor + n)
            gid = floor
            reset = 1
          elseif not epoch then
            epoch = string.sub(ARGV[2], 25 + 32 * n)
            redis.call('HSET', KEYS[1], 'epoch', epoch)
          end
          local fresh = epoch == ARGV[1] and reset == 0 -- the caller knows the epoch: not returned
          -- The set lives as long as its longest-lived record (each carries its own expiry, filtered on
          -- read): a publish with a short max_backlog_age must not expire the others' messages.
          -- In milliseconds: TTL rounds to whole seconds, which cut a short age by up to half a second.
          local function expire(set, ttl)
            if ttl < 0 then
              if fresh then return end
              ttl = -ttl
            end
            local margin = math.min(math.floor(ttl / 16), 60000)
            if redis.call('PTTL', set) < ttl + margin / 2 then
              redis.call('PEXPIRE', set, ttl + margin)
            end
          end
          local function finish(first, last)
            local step = math.max(math.floor(max_global / 16), 1)
            if last > max_global and math.floor(last / step) ~= math.floor((first - 1) / step) then
              redis.call('ZREMRANGEBYSCORE', refs, '-inf', string.format('%d', last - max_global))
            end
          end
          if n == 1 then -- one record (no concurrency): the same steps without the tables
            local set = KEYS[4]
            local key = string.sub(set, at)
            local size, ttl, slack, trim_first = struct.unpack('>dddd', ARGV[2], 25)
            gid = gid + 1
            local mid = redis.call('HINCRBY', KEYS[2], key, '1')
            if mid <= floor then
              mid = floor + 1
              redis.call('HSET', KEYS[2], key, mid)
            end
            local ids, g = struct.pack('>dd', gid, mid), string.format('%d', gid)
            redis.call('ZADD', set, string.format('%d', mid), ids .. ARGV[4])
            redis.call('ZADD', refs, g, string.sub(ids, 9, 16) .. set)
            local cut = (trim_first > 0) and (mid - 1 - trim_first) or 0
            if mid > size and (mid - size) % (slack + 1) == 0 then cut = math.max(cut, mid - size) end
            if cut > 0 then trim(set, cut, mid) end
            expire(set, ttl)
            finish(gid, gid)
            -- The wakeup carries a small record (`<gid>;<record>`): a reader in another process that is
            -- woken by it need not read it back (Redis::Announcements). Larger ones: `<gid>,<channel key>`.
            if #ARGV[4] <= #{ANNOUNCE_MAX} then
              redis.call('PUBLISH', ARGV[3], g .. ';' .. ids .. ARGV[4])
            else
              redis.call('PUBLISH', ARGV[3], g .. ',' .. key)
            end
            if fresh then return {gid, mid} end
            return {gid, mid, epoch, reset}
          end
          -- Channel ids: one HINCRBY per channel for all its records (ids above the floor after a reset).
          -- Tables are by set; each channel's key is cut out of its set's name once.
          local count, sets, key_of = {}, {}, {}
          for i = 1, n do
            local set = KEYS[3 + i]
            if not count[set] then
              sets[#sets + 1] = set
              key_of[set] = string.sub(set, at)
            end
            count[set] = (count[set] or 0) + 1
          end
          local next_mid = {}
          for _, set in ipairs(sets) do
            local key = key_of[set]
            local mid = redis.call('HINCRBY', KEYS[2], key, string.format('%d', count[set])) - count[set] + 1
            if mid <= floor then
              mid = floor + 1
              redis.call('HSET', KEYS[2], key, mid + count[set] - 1)
            end
            next_mid[set] = mid
          end
          local first = gid + 1
          local out = {first}
          local adds, cut, ttl_of, ref_args, last_of = {}, {}, {}, {}, {}
          for i = 1, n do
            local set = KEYS[3 + i]
            local size, ttl, slack, trim_first = struct.unpack('>dddd', ARGV[2], 25 + 32 * (i - 1))
            gid = gid + 1
            local mid = next_mid[set]
            next_mid[set] = mid + 1
            local ids = struct.pack('>dd', gid, mid)
            local add = adds[set]
            if not add then
              add = {}
              adds[set], cut[set], ttl_of[set] = add, 0, -1
            end
            add[#add + 1] = string.format('%d', mid)
            add[#add + 1] = ids .. ARGV[3 + i]
            ref_args[#ref_args + 1] = string.format('%d', gid)
            ref_args[#ref_args + 1] = string.sub(ids, 9, 16) .. set
            if trim_first > 0 then cut[set] = math.max(cut[set], mid - 1 - trim_first) end
            if mid > size and (mid - size) % (slack + 1) == 0 then cut[set] = math.max(cut[set], mid - size) end
            -- The longest ttl; positive (checked) when any record asks.
            local longest = math.max(math.abs(ttl), math.abs(ttl_of[set]))
            ttl_of[set] = (ttl > 0 or ttl_of[set] > 0) and longest or -longest
            out[#out + 1] = mid
            last_of[set] = gid
          end
          for _, set in ipairs(sets) do redis.call('ZADD', set, unpack(adds[set])) end
          redis.call('ZADD', refs, unpack(ref_args))
          for _, set in ipairs(sets) do
            if cut[set] > 0 then trim(set, cut[set], next_mid[set] - 1) end
            expire(set, ttl_of[set])
          end
          finish(first, gid)
          for _, set in ipairs(sets) do
            redis.call('PUBLISH', ARGV[3], string.format('%d', last_of[set]) .. ',' .. key_of[set])
          end
          if not fresh then
            out[#out + 1] = epoch
            out[#out + 1] = reset
          end
          return out
        LUA

        # KEYS refs; ARGV after_global_id limit. The records of the next `limit` references, oldest first,
        # skipping references whose record is gone (its channel expired). Returns {references_read,
        # global_id_of_the_last_one_read, record ...}.
        # KEYS refs meta; ARGV last_id count. Returns {references read, last reference's id, epoch, records...}:
        # the epoch read with the records tells a reader whose process has not yet heard of a reset that they
        # belong to a new store (another process's recovery numbers them above its cursor: read as a
        # continuation, the new store's first messages, numbered below, were never delivered).
        GLOBAL = script(<<~LUA)
          local found = redis.call('ZRANGE', KEYS[1], '(' .. ARGV[1], '+inf', 'BYSCORE', 'LIMIT', 0, ARGV[2], 'WITHSCORES')
          local out = {#found / 2, 0, redis.call('HGET', KEYS[2], 'epoch') or ''}
          for i = 1, #found, 2 do
            local ref = found[i]
            local mid = struct.unpack('>d', ref)
            local rec = redis.call('ZRANGE', string.sub(ref, 9), mid, mid, 'BYSCORE')
            if rec[1] then out[#out + 1] = rec[1] end
            out[2] = found[i + 1]
          end
          return out
        LUA

        # KEYS meta; ARGV known_epoch watermark clock new_epoch wake_channel. Recovers when the store was
        # reset behind the caller's back (as APPEND does); gives an empty store its first epoch; otherwise
        # returns what is there. Returns {epoch, global_id, reset}.
        RECOVER = script(RESET + <<~LUA)
          local st = redis.call('HMGET', KEYS[1], 'epoch', 'gid')
          local gid, watermark = tonumber(st[2]) or 0, tonumber(ARGV[2])
          if (not st[1] and ARGV[1] ~= '') or gid < watermark then
            return {ARGV[4], recover(gid, 0, watermark, tonumber(ARGV[3]), ARGV[4], ARGV[5]), 1}
          end
          if st[1] then return {st[1], gid, 0} end
          redis.call('HSET', KEYS[1], 'epoch', ARGV[4])
          return {ARGV[4], gid, 0}
        LUA

        # KEYS lease; ARGV token ttl_ms. Extends a lease only while this owner still holds it.
        RENEW = script(<<~LUA)
          if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
          return 0
        LUA

        RELEASE = script(<<~LUA)
          if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
          return 0
        LUA
      end
    end
  end
end
