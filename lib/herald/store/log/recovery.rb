# frozen_string_literal: true

module Herald
  module Store
    class Log
      # Opening a log directory and keeping up with it: recovery on open, reading records other processes
      # append, rolling to a new segment, deleting segments nothing is retained in.
      module Recovery
        REFRESH_GAP = 0.001

        private

        def open
          @pid = ForkTracker.pid
          @lock = Monitor.new
          @appended = @lock.new_cond
          @waiting = 0 # threads in Log#wait
          @closed = false
          @watchers ||= Watchers.new # kept by a reopen after a fork (a watcher of the parent's is skipped: its pid)
          @names = {}
          @appends = 0 # counts appends between offers of the GVL (Log#let_others_run)
          @buffer = String.new(capacity: 4096, encoding: Encoding::BINARY)
          @wakeup = nil
          @refreshed_at = 0.0
          @resets = 0
          @directory_checked_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          open_directory
          recover_or_let_go
          @meta_identity = meta_identity # (Replacement)
          @syncer = Syncer.new(@fsync) { @segments.last }
          start_group_commit
          @wakeup = new_wakeup
        end

        # What a store holds of its directory: opened here, and again when the directory was replaced.
        def open_directory
          @index = Index.new(max_size: @max_backlog_size, max_age: @max_backlog_age)
          @segments = []
          @corrupt_records = []
          @directory = Directory.new(@dir)
          @write_lock = @directory.writable ? @directory.open_lock : nil
          @reservation = nil # (Reservation.new takes the OPEN flock: after the unlocked read, see recover_or_let_go)
          @channel_floor = 0
          start_write_lease
        end

        def new_wakeup = Wakeup.new(@directory.join("wakeup"), on_lease_request: method(:give_lease), on_tick: method(:lease_tick)) { refresh_in_batches }

        # In a forked child (a Puma worker of a preloading master): the parent's descriptors, locks and
        # threads are not ours. The index is (copy-on-write memory, same records as on disk), so keep it
        # and reopen the files from where the parent had read them.
        def reopen
          FORK_LOCK.synchronize do
            return unless ForkTracker.forked?(@pid)
            @pid = ForkTracker.pid
            @lock = Monitor.new
            @appended = @lock.new_cond
            @waiting = 0
            return if @closed
            # The inherited descriptor shares the parent's flock (its lease): closing our copy leaves the
            # parent's alone, and keeps a dead parent's lease from outliving it in us.
            @write_lock&.close
            start_write_lease
            @write_lock = @directory.writable ? @directory.open_lock : nil
            @reservation&.reopen
            gone = @segments.reject { |segment| segment.reopen(writable: !@write_lock.nil?) }
            gone.each { |segment| @index.remove_segment(segment.first_id) }
            @segments -= gone
            return open if @segments.empty?
            @syncer = Syncer.new(@fsync) { @segments.last }
            start_group_commit
            @wakeup = new_wakeup
          end
        end

        # A log that cannot be opened (a damaged META) lets go of its files, the OPEN lock above all: held by
        # a forgotten descriptor, it would keep the next open waiting.
        #
        # What is in the directory is read before the write lock is taken (read_unlocked): reading every
        # record of a big log took seconds (4.3 s for 500,000 records), and under the lock every other
        # process's publishes waited that long, or gave up after lock_timeout naming the opener as a hung
        # process. Under the lock, only what was appended since (the tail) is read, the tail's damage cut,
        # and the side files written. So is the OPEN flock (Reservation) taken only then: held during the
        # read, it kept every other opener waiting too.
        def recover_or_let_go
          return recover unless @write_lock
          read = read_unlocked
          @reservation = Reservation.new(@directory)
          locked { recover(read) }
        rescue
          [*@segments, @write_lock, @reservation].each { |f| f&.close }
          raise
        end

        def recover(read = nil)
          ids = @directory.segment_ids
          load_meta(ids)
          read = forget_read unless read && read == [@epoch, side_identity("STATE")] && (@segments.map(&:first_id) - ids).empty?
          unless read # (what read_unlocked read from STATE still holds)
            state = load_state(ids.first)
            @index.restore(state) if state
          end
          known = @segments.to_h { |segment| [segment.first_id, segment] }
          ids.each_with_index do |id, i|
            segment = known[id] || add_segment(id)
            next if read_segment(segment)
            (i == ids.size - 1) ? cut_tail(segment) : corrupt(segment, segment.size)
          end
          load_reservation(rebuild_state: state == false)
          first_segment if @segments.empty? && @write_lock
          @directory.fsync_dir if @write_lock
        end

        # A new log's first segment. Another process recreating the same directory may have made it since the
        # listing (EEXIST): it is read then, not raised.
        def first_segment
          add_segment(@index.last_global_id + 1, create: true)
        rescue Errno::EEXIST
          read_segment(add_segment(@index.last_global_id + 1))
        end

        # Reads STATE and every segment as they are, without the write lock, nothing judged or written (a
        # partial record at the end may be one being written). => [epoch, STATE's identity] for recover to
        # check under the lock; nil when there is nothing to read this way (a new log, no META, a damaged or
        # missing side file: recover does it all, under the lock, as before).
        def read_unlocked
          meta = @directory.read_json("META") or return nil
          ids = @directory.segment_ids
          identity = side_identity("STATE")
          state = @directory.read_json("STATE")
          return nil if state.nil? && (ids.first || 1) != 1
          @segment_bytes = meta.fetch("segment_bytes")
          @index.restore(state) if state
          ids.each { |id| read_segment(add_segment(id)) }
          [meta.fetch("epoch"), identity]
        rescue CorruptStoreError, SystemCallError
          forget_read
        end

        # What read_unlocked read, dropped: STATE changed meanwhile (a writer deleted old segments), or META
        # (another directory). => nil
        def forget_read
          @segments.each(&:close)
          @segments = []
          @index = Index.new(max_size: @max_backlog_size, max_age: @max_backlog_age)
          @corrupt_records = []
          nil
        end

        # A side file's inode and change time (it is replaced by a rename whenever it is written); nil when missing.
        def side_identity(name)
          stat = File.stat(@directory.join(name))
          [stat.ino, stat.ctime.tv_sec, stat.ctime.tv_nsec]
        rescue SystemCallError
          nil
        end

        def load_meta(segment_ids)
          meta = begin
            @directory.read_json("META")
          rescue CorruptStoreError => e
            raise CorruptStoreError.new("#{e.message}. It holds the log's epoch and segment size and cannot be " \
              "rebuilt from the segments: restore it from a backup, or delete it to start a new epoch (the " \
              "messages stay; readers that compare epochs see a reset)", file: e.file)
          end
          if meta.nil? && @write_lock
            Herald.logger.warn "#{@directory.join("META")} is missing: a new epoch starts for the messages already stored" if segment_ids.any?
            meta = {"format" => 1, "epoch" => Store.new_epoch, "segment_bytes" => @segment_bytes}
            @directory.write_atomically("META", JSON.generate(meta))
          end
          @epoch = meta ? meta.fetch("epoch") : Store.new_epoch
          @segment_bytes = meta.fetch("segment_bytes") if meta
        end

        # STATE holds what deleted segments took with them (last ids, retention). Damaged, it is rebuilt once
        # the segments are read (load_reservation); false says so.
        def load_state(first_segment_id)
          state = @directory.read_json("STATE")
          return state if state || (first_segment_id || 1) == 1
          raise CorruptStoreError.new("#{@directory.join("STATE")} is missing but segments before #{first_segment_id} were deleted")
        rescue CorruptStoreError => e
          Herald.logger.warn "#{e.message}: rebuilt from the segments; channel ids restart above the deleted " \
            "segments' ids, and retention set by publishes whose records were all deleted is back to the default"
          false
        end

        # Ids continue above every id that may have been handed out (Reservation). A rebuilt STATE lost the
        # last ids of channels whose records were deleted: channel ids go above every deleted global id.
        def load_reservation(rebuild_state:)
          return unless @reservation
          @index.raise_floor(@reservation.load(@index.last_global_id))
          if rebuild_state
            @reservation.raise_floor((@segments.first&.first_id || 1) - 1)
            save_rebuilt_state
          end
          @channel_floor = @reservation.floor
        end

        def save_rebuilt_state
          @directory.write_atomically("STATE", JSON.generate(@index.snapshot))
        rescue SystemCallError => e
          Herald.logger.warn "#{@directory.join("STATE")}: the rebuilt file could not be saved (#{e.message}); rebuilt again on the next open"
        end

        def add_segment(first_id, create: false)
          segment = Segment.new(@directory.path, first_id, writable: !@write_lock.nil?, create: create)
          @segments << segment
          @index.add_segment(first_id)
          segment
        end

        # Indexes the records appended since the last read; false when damage (or a write in progress)
        # sits at the end.
        def read_segment(segment)
          segment.read_new(on_corrupt: ->(offset) { corrupt(segment, offset) }) do |buffer, pos, length, offset|
            msg = Record.decode(buffer, pos, length, @names)
            # A whole record with a good CRC but an id not above the last one read: a duplicated or
            # misplaced block. Returning it would break id order: damage, reported like a bad CRC.
            next corrupt(segment, offset) if msg.global_id <= @index.last_added
            @index.add(msg, Store.channel_key(msg.channel, msg.site_id), Record.retention(buffer, pos))
          end
        end

        # Reads what other processes appended. Under the write lock nobody is writing, so damage at the
        # end is a dead writer's torn record: cut it before appending after it.
        def catch_up(locked:)
          before = @index.last_global_id
          loop do
            segment = @segments.last or break
            unless read_segment(segment)
              cut_tail(segment) if locked
              break
            end
            break if segment.size < @segment_bytes
            following = @directory.segment_ids.find { |id| id > segment.first_id } or break
            begin
              add_segment(following)
            rescue Errno::ENOENT
              next # deleted since the listing: retention retired it (a writer deletes only what nobody retains)
            end
          end
          return unless @index.last_global_id > before
          @appended.broadcast
          @watchers.call
        end

        # The Wakeup listener's refresh: at most one every REFRESH_GAP, so that while other processes append
        # fast their records are read in runs. Reading costs about 9 us a call plus 1 us a record: poked after
        # every append, each process read the others' records one or two at a time, ~10 us each, and with
        # several processes publishing that reading took more CPU than the publishing (docs/log.md).
        # A poke after a quiet spell is read at once.
        def refresh_in_batches
          wait = @refreshed_at + REFRESH_GAP - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          sleep wait if wait > 0
          refresh
          @refreshed_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          check_directory # (Replacement) at most every CHECK_EVERY
        end

        # Called by the Wakeup listener when another process appended (or every poll interval).
        def refresh
          @lock.synchronize { catch_up(locked: false) unless @closed || ForkTracker.forked?(@pid) }
        end

        def cut_tail(segment)
          return unless @write_lock
          cut = segment.truncate_tail!
          Herald.logger.warn "#{segment.path}: cut #{cut} bytes of torn or damaged tail at offset #{segment.size}" if cut > 0
        rescue SystemCallError => e
          Herald.logger.warn "#{segment.path}: could not cut the damaged tail (#{e.message})"
        end

        def corrupt(segment, offset)
          error = CorruptRecordError.new(segment: segment.path, offset: offset)
          @corrupt_records << error
          Herald.logger.warn "#{error.message}: skipped (run `herald check #{@dir}`)"
        end

        # The active segment is full: sync it, start the next one (named by the next global id), and
        # delete old segments whose records are all gone from every backlog.
        def roll
          @syncer.sync_now(@segments.last) unless @fsync == :never
          storing do
            add_segment(@index.last_global_id + 1, create: true) # EXCL: catch_up found no newer segment
            @directory.fsync_dir
            retire
          end
        end

        def retire
          @index.expire_all
          live = @index.live_segments
          dead = @segments[0...-1].reject { |s| live[s.first_id] }
          return if dead.empty?
          @directory.write_atomically("STATE", JSON.generate(@index.snapshot))
          dead.each do |segment|
            segment.close
            @directory.delete(File.basename(segment.path))
            @segments.delete(segment)
            @index.remove_segment(segment.first_id)
          end
          @directory.fsync_dir
        end

        def final_sync
          @segments.last&.sync unless @fsync == :never || @write_lock.nil?
        rescue SystemCallError, IOError
          nil
        end

        # The last store to close gives back the ids it reserved and did not use, once every segment is
        # durable (:never included), so the next open carries on with the next id.
        def release_ids
          return unless @reservation
          return @reservation.close if @syncer.failure || !File.directory?(@directory.path) # (deleted under it)
          @lock.synchronize do
            locked do
              catch_up(locked: true)
              @segments.each(&:sync)
              @reservation.release(@index.last_global_id)
            end
          end
        rescue SystemCallError, IOError, Error => e
          Herald.logger.warn "#{@dir}: could not give back unused ids at close (#{e.message}); the next open starts above them"
        ensure
          @reservation&.close
        end
      end

      FORK_LOCK = Mutex.new
    end
  end
end
