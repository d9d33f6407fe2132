# frozen_string_literal: true

require "digest/sha1"

module Herald
  module Store
    class Redis
      # The server-side scripts. Each runs atomically, so ids are assigned, stored, trimmed and announced
      # in one step. Keys: meta (hash: epoch, gid, floor), ids (hash: channel key => last message id),
      # the channel's sorted set (score message id) and the global one (score global id), both holding
      # the same record strings (Store::Packed), so trimming a channel removes its records globally too.
      module Scripts
        Script = Struct.new(:source, :sha)

        def self.script(source) = Script.new(source.freeze, Digest::SHA1.hexdigest(source).freeze)

        # A reset (FLUSHALL, a restart without persistence, a failover to a replica that lost writes,
        # an old snapshot) shows as a missing epoch or a global id below what the caller has seen. Ids then
        # restart from a floor above anything handed out before: the caller's watermark or the wall clock
        # in 2**20 ids per second, whichever is higher. Channel ids restart above the floor too, so no
        # reader stalls behind its old last id and no old id is reused.
        # Every process hears of a reset from the keyless wakeup (a global id alone), on which it drops
        # every cached backlog. Lua's unpack() takes at most ~8000 values: `remove` goes in chunks.
        RESET = <<~LUA
          local function recover(gid, floor, watermark, clock, epoch, wake)
            floor = math.max(gid, watermark, clock)
            redis.call('HSET', KEYS[1], 'epoch', epoch, 'gid', floor, 'floor', floor)
            redis.call('PUBLISH', wake, string.format('%d', floor))
            return floor
          end
          local function remove(key, members)
            for i = 1, #members, 1000 do
              redis.call('ZREM', key, unpack(members, i, math.min(i + 999, #members)))
            end
          end
        LUA

        # KEYS meta ids channel global; ARGV channel_key tail max_size ttl_ms known_epoch watermark clock
        # new_epoch max_global wake_channel slack trim_first. Returns {global_id, message_id, epoch, reset}.
        # trim_first > 0 (the channel's size grows from it): the batch's leftovers go first.
        # Trimming runs in batches (once a set is `slack` past its size, about size/16) to keep the
        # common append short; channel backlogs are read newest-first with LIMIT size, so they stay exact.
        APPEND = script(RESET + <<~LUA)
          local st = redis.call('HMGET', KEYS[1], 'epoch', 'gid', 'floor')
          local epoch, gid, floor, reset = st[1], tonumber(st[2]) or 0, tonumber(st[3]) or 0, 0
          local watermark = tonumber(ARGV[6])
          if (not epoch and ARGV[5] ~= '') or gid < watermark then
            epoch = ARGV[8]
            floor = recover(gid, floor, watermark, tonumber(ARGV[7]), epoch, ARGV[10])
            gid = floor
            reset = 1
          elseif not epoch then
            epoch = ARGV[8]
            redis.call('HSET', KEYS[1], 'epoch', epoch)
          end
          gid = gid + 1
          redis.call('HSET', KEYS[1], 'gid', gid)
          local mid = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
          if mid <= floor then
            mid = floor + 1
            redis.call('HSET', KEYS[2], ARGV[1], mid)
          end
          local rec = struct.pack('>dd', gid, mid) .. ARGV[2]
          local extra = tonumber(ARGV[12]) > 0 and redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[12]) or 0
          if extra > 0 then
            local old = redis.call('ZRANGE', KEYS[3], 0, extra - 1)
            redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1)
            remove(KEYS[4], old)
          end
          redis.call('ZADD', KEYS[3], mid, rec)
          redis.call('ZADD', KEYS[4], gid, rec)
          local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[3])
          if over > tonumber(ARGV[11]) then
            local old = redis.call('ZRANGE', KEYS[3], 0, over - 1)
            redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
            remove(KEYS[4], old)
          end
          -- The set lives as long as its longest-lived record (each carries its own expiry, filtered on
          -- read): a publish with a short max_backlog_age must not expire the others' messages.
          -- In milliseconds: TTL rounds to whole seconds, which cut a short age by up to half a second.
          if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[3], ARGV[4]) end
          over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[9])
          if over > tonumber(ARGV[9]) / 16 then redis.call('ZREMRANGEBYRANK', KEYS[4], 0, over - 1) end
          redis.call('PUBLISH', ARGV[10], string.format('%d', gid) .. ',' .. ARGV[1])
          return {gid, mid, epoch, reset}
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
