# frozen_string_literal: true

module Herald
  module Store
    class Log
      # The write lock (an flock on LOCK) kept between appends: a lease. Taking and dropping the flock
      # around every append, and asking the file's size (others may have appended meanwhile), cost three
      # syscalls of the four a publish made; a process that keeps the lock knows nobody appended since its
      # last write, so an append is one write. docs/log.md has the design and its figures.
      #
      # Another process (or another store instance on the same directory) that wants to write and finds
      # the lock taken asks for it: a "lease" datagram to every open store's wakeup socket (Wakeup). The
      # holder's listener thread gives the lock up once it has held it MIN_HOLD, between two appends (it
      # takes the store's lock first), and then keeps away for STEP_BACK so the asker gets its turn. The
      # asker polls with LOCK_NB and asks again every ASK_EVERY (a datagram can be lost). Whoever takes the
      # lock after someone else held it reads what was appended meanwhile, and cuts a dead writer's torn
      # tail, before it appends: as before, ids follow on densely, in commit order.
      #
      # The kernel frees the flock when its holder dies (kill -9 included). A store whose wakeup socket could
      # not be bound cannot hear an asker, so it drops the lock after every append, as before.
      #
      # A holder that cannot answer (stopped by SIGSTOP or a suspended console, hung, or its listener kept
      # from running) would keep everyone else from writing. So the listener drops a lease nobody used for
      # IDLE, and a writer that waited `lock_timeout` seconds raises TimeoutError naming the holder's pid
      # (after a warning at WAIT_WARN) instead of hanging.
      module WriteLease
        MIN_HOLD = 0.002
        STEP_BACK = 0.0005
        ASK_EVERY = 0.005
        POLL = 0.0001 # first wait between LOCK_NB attempts; doubles up to POLL_MAX
        POLL_MAX = 0.002
        IDLE = 0.02
        WAIT_WARN = 1.0

        private

        def start_write_lease
          @leased = false # this store holds the flock
          @lease_fresh = false # taken since the last append: others may have appended
          @leased_at = 0.0
          @gave_lease_at = -STEP_BACK
          @used_at = 0.0
        end

        # Runs the block holding the write lock; under @lock.
        def locked
          take_lease unless @leased
          yield
        ensure
          if @wakeup&.listening?
            @used_at = now
          else
            drop_lease
          end
        end

        def take_lease
          step_back = @gave_lease_at + STEP_BACK - now
          sleep step_back if step_back > 0
          wait = POLL
          asked_at = nil
          started = now
          warned = false
          until @write_lock.flock(File::LOCK_EX | File::LOCK_NB)
            if asked_at.nil? || now - asked_at > ASK_EVERY
              Wakeup.ask_for_lease(@directory.join("wakeup"), except: (@wakeup if @wakeup&.listening?))
              asked_at = now
            end
            warned = waited_too_long(now - started, warned)
            sleep wait
            wait = [wait * 2, POLL_MAX].min
          end
          @leased = true
          @lease_fresh = true
          @leased_at = now
          @wakeup&.nudge # its listener is to drop the lease once unused for IDLE: it must know it has one
        end

        # Raises once the wait reached lock_timeout; warns once past WAIT_WARN. Returns whether it warned.
        def waited_too_long(waited, warned)
          if waited >= @lock_timeout
            raise TimeoutError, "#{@dir}: the log's write lock has been held by #{lock_holder} for #{@lock_timeout} s " \
              "(a stopped or hung process?); nothing was written"
          end
          return warned if warned || waited < WAIT_WARN
          Herald.logger.warn "#{@dir}: waiting for the log's write lock, held by #{lock_holder}"
          true
        end

        # Who holds LOCK, from Linux's /proc/locks (pid, device:inode of the file).
        def lock_holder
          inode = ":#{@write_lock.stat.ino}"
          File.foreach("/proc/locks") do |line|
            fields = line.split
            return "pid #{fields[4]}" if fields[1] == "FLOCK" && fields[5]&.end_with?(inode)
          end
          "another process"
        rescue SystemCallError, IOError
          "another process"
        end

        # Called by the Wakeup listener after every wait: drops a lease unused for IDLE, and returns how long
        # the listener may wait before it looks again (nil: no lease, wait as long as it likes).
        def lease_tick
          return nil unless @leased
          idle = now - @used_at
          return IDLE - idle if idle < IDLE
          @lock.synchronize do
            drop_lease if @leased && !ForkTracker.forked?(@pid) && now - @used_at >= IDLE
          end
          nil
        rescue IOError
          nil # closed meanwhile
        end

        def drop_lease
          return unless @leased
          @leased = false
          @write_lock.flock(File::LOCK_UN)
        end

        # Called by the Wakeup listener when another store asked for the lease. A lease held less than
        # MIN_HOLD is kept that long first (a busy writer gets a run of appends per handoff), measured under
        # the store's lock: a lease taken while this thread waited for the lock is a new one.
        def give_lease
          loop do
            wait = @lock.synchronize do
              return unless @leased && !ForkTracker.forked?(@pid)
              held = now - @leased_at
              next MIN_HOLD - held if held < MIN_HOLD
              drop_lease
              @gave_lease_at = now
              return
            end
            sleep wait
          end
        rescue IOError
          nil # closed meanwhile
        end

        def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
