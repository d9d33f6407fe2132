# frozen_string_literal: true

module Herald
  module Store
    # The embedded, durable store: an append-only log of segment files in one directory, shared by every
    # process that opens it (docs/log.md). Each process keeps what is retained in memory (the
    # Index), reads records other processes append (woken by Wakeup), and writes under an flock so ids
    # are assigned in commit order across processes.
    #
    #   Herald::Store::Log.new(dir: "tmp/herald", fsync: :interval) # or :always, :never
    #
    # Ids and crashes: a record is written whole to the OS before append returns, so a killed process
    # loses nothing it returned. A record can still reach readers before it reaches the disk (:interval
    # and :never modes; :always up to one fsync before its publisher returns), and a power loss or damage
    # at the tail can take it back after a reader saw it: its id may sit in a saved cursor or a browser.
    # So ids are reserved on disk before they are handed out (Reservation, the IDS file), and after an
    # unclean stop ids, global and per channel, go on above every id that may have been seen: an id is
    # never handed out twice. Old segments are deleted only after a STATE file saved the last ids, so
    # deleting records never lowers them. META, STATE and IDS are checked on open: a damaged STATE or IDS
    # is rebuilt (with a warning, ids only go up), a damaged META raises CorruptStoreError.
    class Log
      include Recovery
      include GroupCommit
      include WriteLease
      include Cursors
      include Controls
      include Replacement

      DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
      DEFAULT_DIR = "herald-data"
      PASS_EVERY = 64 # appends between two offers of the GVL to other threads (about a millisecond)

      # Where the embedded log lives when nobody says: $HERALD_DIR, else ./herald-data (facade, CLI).
      # An empty HERALD_DIR is a mistake (an unset variable in a template), not "the current directory".
      def self.default_dir
        dir = ENV.fetch("HERALD_DIR", DEFAULT_DIR)
        raise ConfigurationError, "HERALD_DIR is empty: name the log's directory, or unset it for ./#{DEFAULT_DIR}" if dir.empty?
        dir
      end

      attr_reader :dir, :fsync, :corrupt_records, :max_payload_bytes

      # max_payload_bytes: the most data (as encoded) a message may carry, Limits::MAX_PAYLOAD_BYTES at most.
      def initialize(dir:, fsync: :interval, segment_bytes: DEFAULT_SEGMENT_BYTES,
        max_backlog_size: DEFAULT_MAX_BACKLOG_SIZE, max_backlog_age: DEFAULT_MAX_BACKLOG_AGE, lock_timeout: 30, on_reset: nil,
        max_payload_bytes: Limits::MAX_PAYLOAD_BYTES)
        Limits.validate_retention!(max_backlog_size, max_backlog_age, error: InvalidArgumentError)
        Limits.validate_seconds!(:lock_timeout, lock_timeout)
        raise InvalidArgumentError, "Unknown fsync mode #{fsync.inspect}, expected one of #{Syncer::MODES.inspect}" unless Syncer::MODES.include?(fsync)
        raise InvalidArgumentError, "segment_bytes must be a positive Integer, got #{segment_bytes.inspect}" unless segment_bytes.is_a?(Integer) && segment_bytes > 0
        @max_payload_bytes = Limits.validate_max_payload!(max_payload_bytes)
        @dir = dir.to_s
        raise InvalidArgumentError, "dir must name a directory, got #{dir.inspect}" if @dir.empty?
        @fsync = fsync
        @segment_bytes = segment_bytes
        @max_backlog_size = max_backlog_size
        @max_backlog_age = max_backlog_age
        @lock_timeout = lock_timeout # how long an append waits for another process's write lock (WriteLease)
        # The directory was replaced under this store (Replacement): a new epoch, ids start over.
        @on_reset = on_reset || ->(old, new) { Herald.logger.warn "log #{@dir} was replaced under a running store (epoch #{old} -> #{new}): readers start again from the new directory's messages" }
        open
      end

      attr_reader :epoch
      alias_method :known_epoch, :epoch

      def append(channel, payload, codec:, created_at: nil, user_ids: nil, group_ids: nil, client_ids: nil,
        site_id: nil, max_backlog_size: nil, max_backlog_age: nil)
        Limits.validate_append!(channel, site_id, payload, @max_payload_bytes, created_at)
        Limits.validate_retention!(max_backlog_size, max_backlog_age) if max_backlog_size || max_backlog_age
        # Checked here, before a group commit batches it with others: Record.encode packs them again.
        Limits.pack_targets(user_ids, group_ids, client_ids) if user_ids || group_ids || client_ids
        created_at = created_at.to_f if created_at # an Integer is stored and returned as the Float it is read back as
        reopen if @pid != ForkTracker.pid # an attr_reader: cheaper than a method, far cheaper than getpid(2)
        if @fsync == :always # concurrent appenders share each fsync (GroupCommit)
          return commit_grouped([channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id,
            max_backlog_size, max_backlog_age])
        end
        msg = @lock.synchronize { append_locked(channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_backlog_size, max_backlog_age) }
        # Other processes first: waking this process's event loop first let it take the GVL before the
        # pokes went out (reading the wakeup directory releases it), and hold it for its whole fan-out.
        @wakeup&.notify(@used_at) # (nil while a replaced directory is being opened: Replacement)
        @watchers.call
        # The write keeps Ruby's GVL (Segment#write), so a thread publishing in a loop would hold it until
        # Ruby's 100 ms time slice ends: the wakeup listener (another process asking for the write lease,
        # appends to read), the fsync thread and other publishers would wait that long. So it is offered
        # every PASS_EVERY appends; with nobody waiting, Thread.pass is one sched_yield.
        Thread.pass if (@appends += 1) % PASS_EVERY == 0
        msg
      end

      def last_id(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        reading { @index.last_id(Store.channel_key(channel, site_id)) }
      end

      def last_ids(channels, site_id: nil)
        Limits.validate_keys!(channels, site_id)
        reading { channels.to_h { |c| [c, @index.last_id(Store.channel_key(c, site_id))] } }
      end

      def last_global_id = reading { @index.last_global_id }

      # The same without the lock, for Rack::ReplyCache's check on every poll (2,900 of its instructions with
      # the Mutex): reading an Integer is atomic under the GVL; an append in progress may not be seen yet, as
      # for a poll that came a moment sooner.
      def peek_last_global_id
        reopen if @pid != ForkTracker.pid # an attr_reader: cheaper than a method, far cheaper than getpid(2)
        @index.last_global_id
      end

      def local_reads? = true

      # Reads are local already: readers read global_backlog.
      def announced_backlog(_last_id, limit: nil) = nil

      # The directory it keeps its files in (health checks measure its free disk).
      def data_dir = @dir

      # What its segment files hold on disk now, every process's appends included (metrics, dashboard).
      def bytes_on_disk
        Dir.children(@dir).sum do |name|
          Segment.first_id(name) ? File.size(File.join(@dir, name)) : 0
        rescue Errno::ENOENT
          0 # deleted by retention meanwhile
        end
      end

      def backlog(channel, last_id = 0, site_id: nil)
        Limits.validate_key!(channel, site_id)
        Limits.validate_id!(:last_id, last_id)
        reading { @index.backlog(Store.channel_key(channel, site_id), last_id) }
      end

      def global_backlog(last_id = 0, limit: nil)
        Limits.validate_id!(:last_id, last_id)
        Limits.validate_limit!(limit)
        reading { @index.global_backlog(last_id, limit) }
      end

      def wait(last_global_id, timeout:)
        Limits.validate_wait!(last_global_id, timeout)
        reopen if @pid != ForkTracker.pid # an attr_reader: cheaper than a method, far cheaper than getpid(2)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        @lock.synchronize do
          resets = @resets
          loop do
            raise ClosedError, "store is closed" if @closed
            break if @index.last_global_id > last_global_id || @resets != resets # (a reset: ids started over)
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            break if left <= 0
            begin
              @waiting += 1 # an append broadcasts only when someone waits (append_locked)
              @appended.wait(left)
            ensure
              @waiting -= 1
            end
          end
          @index.last_global_id
        end
      end

      # The block runs whenever this store's last global id moves: on the appending thread after each append,
      # and on the thread that read other processes' records (Store::Watchers). => a Watch (#cancel); its #io,
      # when not nil, is a socket other processes' appends poke: select on it and call Watch#readable when it
      # is readable, and their records are read in on that thread (no listener thread in between).
      def watch(&block)
        reopen if @pid != ForkTracker.pid # an attr_reader: cheaper than a method, far cheaper than getpid(2)
        socket = @wakeup&.watch_socket
        return @watchers.add(block) unless socket
        @watchers.add(block, io: socket.io, on_readable: -> { read_poked(socket) }, on_cancel: -> { socket.close })
      end

      def close
        @lock.synchronize do
          return if @closed
          @closed = true
          @appended.broadcast
        end
        return if ForkTracker.forked?(@pid) # the parent's files and sockets are the parent's to close
        @wakeup&.close
        @syncer.stop
        final_sync
        release_ids
        @segments.each(&:close)
        @retired_segments&.each { |segment| segment.close unless segment.closed? } # (Replacement)
        @lock.synchronize { drop_lease } if @write_lock # a forked child may share the descriptor: closing is not enough
        @write_lock&.close
        @waiters&.close
        @watchdog&.kill
      end

      def closed? = @closed

      def retention(channel, site_id: nil)
        Limits.validate_key!(channel, site_id)
        reading do
          ch = @index.channels[Store.channel_key(channel, site_id)]
          ch ? [ch.max_size, ch.max_age] : [@max_backlog_size, @max_backlog_age]
        end
      end

      # For operators: segments and bytes on disk, fsync policy, free disk, whether this process holds the
      # write lease now (another process may hold it between its appends: see WriteLease).
      def stats
        segments = @directory.segment_ids.filter_map { |id| File.size(File.join(@dir, Segment.file_name(id))) rescue nil } # standard:disable Style/RescueModifier
        {"kind" => "log", "dir" => File.expand_path(@dir), "fsync" => @fsync.to_s, "segments" => segments.size,
         "segment_bytes" => segments.sum, "free_disk_bytes" => free_disk, "write_lease" => @leased ? "this process (#{Store.lease_holder_id})" : "not this process",
         "corrupt_records" => @corrupt_records.size, "max_backlog_size" => @max_backlog_size, "max_backlog_age" => @max_backlog_age}
      end

      private

      # df(1): Ruby has no statvfs. nil when it cannot say.
      def free_disk
        out = IO.popen(["df", "-Pk", @dir], err: File::NULL, &:read)
        Integer(out.lines[1].split[3], 10) * 1024
      rescue SystemCallError, ArgumentError, NoMethodError, TypeError
        nil
      end

      # A watcher's socket was poked: another process appended. Its records are read here, on the watcher's
      # thread (the listener thread, poked as well, finds nothing left to read).
      def read_poked(socket)
        socket.drain
        refresh
      end

      def reading
        reopen if @pid != ForkTracker.pid # an attr_reader: cheaper than a method, far cheaper than getpid(2)
        @lock.synchronize { yield }
      end

      # One record of a publish (fsync :interval or :never), under @lock: what `locked`, `prepare_append`,
      # `reserve`, `retention_for`, `stage` and `storing` do for a batch, written out for one record. Each
      # method layer cost a few hundred instructions, a tenth of a publish in all.
      def append_locked(channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id, max_size, max_age)
        writable! if @closed || @syncer.failure || !@write_lock
        begin
          take_lease unless @leased
          segment = @segments.last
          if (@lease_fresh && segment.unread?) || segment.size >= @segment_bytes
            prepare_append
            segment = @segments.last
          end
          @lease_fresh = false
          gid = @index.last_global_id + 1
          reserve(gid) if gid > @reservation.reserved
          key = site_id ? Store.channel_key(channel, site_id) : channel
          ch = @index.channel(key)
          retention = if max_size || max_age
            [max_size || ch.max_size, max_age || ch.max_age]
          elsif ch.max_size != @max_backlog_size || ch.max_age != @max_backlog_age
            [ch.max_size, ch.max_age] # the channel's own, carried by each record (`carried`)
          end
          channel = @names[channel] || intern(channel)
          at = created_at || Process.clock_gettime(Process::CLOCK_REALTIME)
          mid = ((ch.last_id < @channel_floor) ? @channel_floor : ch.last_id) + 1
          if site_id || user_ids || group_ids || client_ids
            targets = [user_ids, group_ids, client_ids] if user_ids || group_ids || client_ids
            Record.encode(@buffer, gid, mid, channel, site_id, payload, codec.id, at, targets, retention&.[](0), retention&.[](1))
          else
            parts = constant_parts(ch, channel, codec.id, retention)
            Record.encode_constant(@buffer, gid, mid, at, parts[3], parts[4], payload)
          end
          msg = Message::Built.new(gid, mid, channel, payload, codec, at, user_ids, group_ids, client_ids, site_id)
          begin
            segment.write(@buffer)
          rescue SystemCallError => e
            raise storing_error(e)
          end
          @syncer.written
          @index.add_to(ch, msg, retention)
          @appended.broadcast if @waiting > 0
          msg
        rescue LogReplacedError
          retry # reopened: written into the new directory, with its ids
        ensure
          after_append
        end
      end

      # The channel's Record.constant_parts for this codec and retention: packed again only when they change.
      def constant_parts(ch, channel, codec_id, retention)
        max_size = retention&.[](0)
        max_age = retention&.[](1)
        parts = ch.record
        return parts if parts && parts[0] == codec_id && parts[1] == max_size && parts[2] == max_age
        ch.record = [codec_id, max_size, max_age, *Record.constant_parts(channel, codec_id, max_size, max_age)].freeze
      end

      def writable!
        raise ClosedError, "store is closed" if @closed
        @syncer.check!
        return if @write_lock
        raise ReadOnlyError, "#{@dir} is read-only for this process: stored messages can be read, but " \
          "publishing needs a writable directory (check its permissions and mount options)"
      end

      # Catches up with other processes' appends (and cuts a dead writer's torn tail), then rolls to a
      # new segment when the active one is full. Under the write lock. Only a lease just taken can find
      # others' appends (WriteLease): while it is kept, nobody else writes, and the size is not asked.
      def prepare_append
        segment = @segments.last
        catch_up(locked: true) if (@lease_fresh && segment.unread?) || segment.size >= @segment_bytes
        @lease_fresh = false
        roll if @segments.last.size >= @segment_bytes
      end

      # Encodes one record into `buffer` (cleared first) and returns its Message; `pending` records of the
      # same channel are ahead of it in the batch being written.
      def stage(buffer, ch, pending, retention, channel, payload, codec, created_at, user_ids, group_ids, client_ids, site_id)
        channel = @names[channel] || intern(channel)
        targets = [user_ids, group_ids, client_ids] if user_ids || group_ids || client_ids
        at = created_at || Process.clock_gettime(Process::CLOCK_REALTIME)
        gid = @index.last_global_id + 1 + @staged
        mid = ((ch.last_id < @channel_floor) ? @channel_floor : ch.last_id) + 1 + pending
        Record.encode(buffer, gid, mid, channel, site_id, payload, codec.id, at, targets, retention&.[](0), retention&.[](1))
        Message::Built.new(gid, mid, channel, payload, codec, at, user_ids, group_ids, client_ids, site_id)
      end

      # Ids up to `last` are reserved on disk before they are handed out (Reservation); the log written so
      # far is synced first, which bounds how far a reservation runs past the durable log.
      def reserve(last)
        return if last <= @reservation.reserved
        @reservation.reserve(last) { sync_before_reserving }
      rescue Errno::ENOENT => e
        replaced_while_writing!(e)
      rescue SystemCallError => e
        raise storing_error(e)
      end

      def sync_before_reserving
        segment = @segments.last
        @syncer.sync_now(segment) unless @fsync == :never || segment.size.zero?
      end

      # The retention a record carries: what its publish names (the rest from the channel), else the
      # channel's own when not the store's default.
      def retention_for(ch, max_size, max_age)
        return carried(ch) unless max_size || max_age
        [max_size || ch.max_size, max_age || ch.max_age]
      end

      # A channel's non-default retention goes into each of its records, so it survives the deletion of
      # the segment holding the publish that set it.
      def carried(ch)
        [ch.max_size, ch.max_age] unless ch.max_size == @max_backlog_size && ch.max_age == @max_backlog_age
      end

      def intern(channel) = @names[channel] = -channel

      # Turns the OS's refusals into errors that say what to do. A failed write leaves no half record.
      def storing
        yield
      rescue SystemCallError => e
        raise storing_error(e)
      end

      # The error to raise for a refused write: one that says what to do, else the OS's own.
      def storing_error(e)
        case e
        when Errno::ENOSPC, Errno::EDQUOT
          StoreFullError.new("no space left for the log in #{@dir} (#{e.message}): free disk space or lower " \
            "max_backlog_size/max_backlog_age; stored messages stay readable")
        when Errno::EFBIG
          StoreFullError.new("a log segment in #{@dir} hit the file-size limit (#{e.message}): raise `ulimit -f` " \
            "or use a smaller segment_bytes; stored messages stay readable")
        when Errno::EROFS, Errno::EACCES, Errno::EPERM
          ReadOnlyError.new("#{@dir} refuses writes (#{e.message}): make it writable (permissions, mount " \
            "options); stored messages stay readable")
        else StoreError.new("writing the log in #{@dir} failed: #{e.class}: #{e.message}")
        end
      end
    end
  end
end
