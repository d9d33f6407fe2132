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
        RESET = <<~LUA
          local function recover(gid, floor, watermark, clock, epoch)
            floor = math.max(gid, watermark, clock)
            redis.call('HSET', KEYS[1], 'epoch', epoch, 'gid', floor, 'floor', floor)
            return floor
          end
        LUA

        # Drops the channel's oldest records beyond `size` (from both sets) once more than `slack` are over.
        TRIM = <<~LUA
          local function trim(size, slack)
            local over = redis.call('ZCARD', KEYS[3]) - size
            if over > slack then
              local old = redis.call('ZRANGE', KEYS[3], 0, over - 1)
              redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
              redis.call('ZREM', KEYS[4], unpack(old))
            end
          end
        LUA

        # KEYS meta ids channel global; ARGV channel_key tail max_size ttl known_epoch watermark clock
        # new_epoch max_global wake_channel slack trim_first. Returns {global_id, message_id, epoch, reset}.
        # Trimming runs in batches (once a set is `slack` past its size, about size/16) to keep the
        # common append short; channel backlogs are read newest-first with LIMIT size, so they stay exact.
        # trim_first (when > 0: the channel's size grows from it) drops the batch's leftovers first.
        APPEND = script(RESET + TRIM + <<~LUA)
          local st = redis.call('HMGET', KEYS[1], 'epoch', 'gid', 'floor')
          local epoch, gid, floor, reset = st[1], tonumber(st[2]) or 0, tonumber(st[3]) or 0, 0
          local watermark = tonumber(ARGV[6])
          if (not epoch and ARGV[5] ~= '') or gid < watermark then
            epoch = ARGV[8]
            floor = recover(gid, floor, watermark, tonumber(ARGV[7]), epoch)
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
          if tonumber(ARGV[12]) > 0 then trim(tonumber(ARGV[12]), 0) end
          redis.call('ZADD', KEYS[3], mid, rec)
          redis.call('ZADD', KEYS[4], gid, rec)
          trim(tonumber(ARGV[3]), tonumber(ARGV[11]))
          redis.call('EXPIRE', KEYS[3], ARGV[4])
          local over = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[9])
          if over > tonumber(ARGV[9]) / 16 then redis.call('ZREMRANGEBYRANK', KEYS[4], 0, over - 1) end
          redis.call('PUBLISH', ARGV[10], string.format('%d', gid) .. ',' .. ARGV[1])
          return {gid, mid, epoch, reset}
        LUA

        # KEYS meta; ARGV watermark clock new_epoch. Recovers when the store was reset behind the caller's
        # back; otherwise returns what is there. Returns {epoch, global_id}.
        RECOVER = script(RESET + <<~LUA)
          local st = redis.call('HMGET', KEYS[1], 'epoch', 'gid')
          local gid, watermark = tonumber(st[2]) or 0, tonumber(ARGV[1])
          if st[1] and gid >= watermark then return {st[1], gid} end
          return {ARGV[3], recover(gid, 0, watermark, tonumber(ARGV[2]), ARGV[3])}
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
