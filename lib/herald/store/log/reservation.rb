# frozen_string_literal: true

module Herald
  module Store
    class Log
      # Ids are reserved on disk before they are handed out, so no id anyone may have seen is assigned twice.
      #
      # In fsync :interval (or :never) mode a record reaches readers before it reaches the disk. A power
      # loss, or damage at the tail, takes it back; without a trace of it its ids would be assigned again,
      # and a reader that saw the old ones (a saved cursor, a browser's last id) would skip the new records.
      # So IDS says how far ids may have gone ("reserved") and is fsynced before any id above it is
      # assigned: one small write every `step` ids (doubling while ids go fast), not one per publish.
      #
      # Every open store holds a shared flock on OPEN. A store that finds itself alone on open, with the log
      # ending below "reserved", knows the last run stopped without closing (crash, kill -9, power loss)
      # and records may be gone: ids restart above "reserved", and so do channel ids ("floor": each
      # channel's next message id is above it; a message id never exceeds its global id, so none is reused).
      # The last store to close brings "reserved" down to the end of the synced log, so a clean restart
      # carries on with the next ids.
      class Reservation
        FIRST_STEP = 1024
        MAX_STEP = 1 << 20
        FAST = 1.0 # seconds: a reservation used up faster than this doubles the next ones
        # Before "reserved" is raised the log is synced, so (without :never) "reserved" never runs more
        # than a step and a group-commit batch past the durable end of the log: when IDS itself is
        # damaged, ids restart this far above the log's end.
        REBUILD_MARGIN = 4 * MAX_STEP

        attr_reader :reserved, :floor

        def initialize(directory)
          @directory = directory
          @step = FIRST_STEP
          @extended_at = -FAST
          @open = File.new(directory.join("OPEN"), File::RDONLY | File::CREAT, 0o644)
          @alone = @open.flock(File::LOCK_EX | File::LOCK_NB)
          @open.flock(File::LOCK_SH) unless @alone
        end

        # On open, under the write lock, once the segments are read. Returns the global id to continue
        # after: last_global_id, or "reserved" when records may have been lost.
        def load(last_global_id)
          ids = read_ids(last_global_id)
          @reserved, @floor = ids ? ids.values_at("reserved", "floor") : [last_global_id, 0]
          last = [last_global_id, @floor].max # a floor from an earlier open holds even before ids pass it
          lost_tail(last) if @alone && @reserved > last && !ids["rebuilt"]
          @reserved = [@reserved, last].max
          save_on_open(last) if ids.nil? || ids["rebuilt"] || ids.values_at("reserved", "floor") != [@reserved, @floor]
          @open.flock(File::LOCK_SH) if @alone # others may open now
          [last, @floor].max
        end

        # Raises the floor of channel ids (STATE was rebuilt: channels of deleted segments are unknown).
        def raise_floor(id)
          return if id <= @floor
          @floor = id
          save_on_open(@reserved)
        end

        # Under the write lock, before ids up to `last` are assigned. `sync` makes the log written so far
        # durable first, which bounds how far "reserved" runs ahead of it.
        def reserve(last, &sync)
          return if last <= @reserved
          ids = read_ids(last)
          if ids["rebuilt"] # IDS damaged or deleted while the log was open
            write(ids["reserved"])
            return @reserved = ids["reserved"]
          end
          @reserved = ids["reserved"] if ids["reserved"] > @reserved # another process reserved
          keep_floor(ids)
          return if last <= @reserved
          sync.call
          now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          @step = [@step * 2, MAX_STEP].min if now - @extended_at < FAST # never smaller: bursts come back
          @extended_at = now
          write(last + @step)
          @reserved = last + @step # only once it is on disk: a failed write reserves nothing
        end

        # At close, under the write lock with the log synced to `last_global_id`: the last store open
        # gives back the ids it did not use.
        def release(last_global_id)
          return unless @open.flock(File::LOCK_EX | File::LOCK_NB) && File.directory?(@directory.path)
          ids = begin
            @directory.read_json("IDS")
          rescue CorruptStoreError
            nil # rewritten whole below
          end
          return if ids && ids["reserved"] == last_global_id # a reader's close writes nothing
          keep_floor(ids)
          write(last_global_id)
        end

        # In a forked child: a shared flock of its own, and no trust in the parent's cached reservation (the
        # parent may have closed and given it back). Closing the inherited descriptor leaves the parent's
        # lock alone while the parent keeps its own; once the parent closed, it would be ours and block us.
        def reopen
          @open.close
          @open = File.new(@directory.join("OPEN"), File::RDONLY | File::CREAT, 0o644)
          @open.flock(File::LOCK_SH)
          @reserved = 0
        end

        def close = @open.close

        private

        def lost_tail(last_global_id)
          Herald.logger.info "#{@directory.path}: the log ends at id #{last_global_id}, ids up to #{@reserved} may have been " \
            "handed out before the last process stopped without closing the store; new ids start above #{@reserved}"
          @floor = @reserved
        end

        # IDS as a Hash; nil for a new log. A damaged or missing IDS is rebuilt from the log's end with a
        # margin no reservation reaches past (REBUILD_MARGIN).
        def read_ids(last_global_id)
          ids = @directory.read_json("IDS")
          return ids if ids || last_global_id.zero?
          raise CorruptStoreError, "#{@directory.join("IDS")} is missing in a log that holds records (deleted, or written by an older Herald)"
        rescue CorruptStoreError => e
          rebuilt = last_global_id + REBUILD_MARGIN
          Herald.logger.warn "#{e.message}: rebuilt; ids (global and per channel) restart above #{rebuilt} so none is reused"
          {"reserved" => rebuilt, "floor" => rebuilt, "rebuilt" => true}
        end

        # A full or read-only disk must not stop the log from opening for reading: what could not be saved is
        # kept here, and the first append has to save it (nothing counts as reserved until it is).
        def save_on_open(last)
          write
        rescue SystemCallError => e
          Herald.logger.warn "#{@directory.join("IDS")}: could not be saved on open (#{e.message}); publishing needs it"
          @reserved = last
        end

        # Another process may have raised the floor since this one opened (it rebuilt STATE): keep it.
        def keep_floor(ids)
          @floor = ids["floor"] if ids && ids["floor"] > @floor
        end

        def write(reserved = @reserved)
          @directory.write_atomically("IDS", JSON.generate({"reserved" => reserved, "floor" => @floor}))
        end
      end
    end
  end
end
