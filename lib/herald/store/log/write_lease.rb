# frozen_string_literal: true

module Herald
  module Store
    class Log
      # The write lock (an flock on LOCK) kept between appends: a lease. Taking and dropping the flock
      # around every append, and asking the file's size (others may have appended meanwhile), cost three
      # syscalls of the four a publish made; a process that keeps the lock knows nobody appended since its
      # last write, so an append is one write. docs/log.md has the design and its figures.
      #
      # Several processes writing at once (a Puma cluster whose workers all publish) take the lease in turns.
      # One that finds the lock taken waits in a blocking flock(LOCK_EX): the kernel wakes it when the lock is
      # dropped, no polling. While it waits it holds a shared flock on WAITERS, and a holder that has held
      # the lease MIN_HOLD looks at WAITERS every LOOK_EVERY (two syscalls) and hands the lease over when
      # someone waits. Before, a waiter sent a "lease" datagram to every open store each time and polled the
      # lock with sleeps, and the holder's listener thread had to get the GVL to hear it: 100-150 datagrams
      # and as many listener wakeups for 6,000 appends of two processes, and the handoff went to whoever
      # polled first. Whoever takes the lock after someone else held it reads what was appended meanwhile,
      # and cuts a dead writer's torn tail, before it appends: as before, ids follow on densely, in commit order.
      #
      # A holder that is not appending hears no one through WAITERS: a waiter that saw no contention for
      # CONTENDED asks with a datagram (the holder's listener gives the lease up between two appends), and the
      # listener drops a lease unused for IDLE (IDLE_CONTENDED while others write). A holder that gave the
      # lease up keeps away for a step back so the woken waiter gets it; taking it back anyway (the waiter was
      # not scheduled in time) doubles the next step back (up to STEP_BACK_MAX), so a busy writer cannot
      # keep the lock from a slow one.
      #
      # The kernel frees the flock when its holder dies (kill -9 included). A store without a listening wakeup
      # socket cannot hear an asker: it drops the lock after every append and waits for it by polling
      # (LOCK_NB with a backoff, asking every ASK_EVERY), as before.
      #
      # A holder that cannot answer (stopped by SIGSTOP or a suspended console, hung) would keep everyone else
      # from writing: a watchdog thread of the waiting store warns at WAIT_WARN (naming the holder) and after
      # `lock_timeout` seconds interrupts the wait with TimeoutError instead of letting it hang.
      module WriteLease
        MIN_HOLD = 0.01 # a lease is held at least this long before it is handed over (a run of appends)
        STEP_BACK = 0.0005
        STEP_BACK_MAX = 0.008
        ASK_EVERY = 0.005
        POLL = 0.0001 # first wait between LOCK_NB attempts (no listener); doubles up to POLL_MAX
        POLL_MAX = 0.002
        IDLE = 0.02
        WAIT_WARN = 1.0
        CONTENDED = 0.05 # for this long after another writer was seen, a waiter relies on WAITERS (no datagram)
        LOOK_EVERY = 0.0005 # how often a lease holder past MIN_HOLD looks for blocked writers (WAITERS)
        LOOK_QUIET = 0.01 # the same while no other writer was seen for CONTENDED
        IDLE_CONTENDED = 0.001 # a lease unused this long is dropped while others write (see lease_tick)
        BUSY_TICK = 0.005
        UNUSED = 0.001 # a lease unused this long is given up at once when asked for, whatever MIN_HOLD says
        WATCH = 0.1 # how often a blocked writer is looked at (start_watchdog)
        WATCHDOG_IDLE = 100 # WATCH periods without a blocked writer before the watchdog thread stops

        # What this store did for the write lock since it opened (tests, benchmarks): leases taken, waits in a
        # blocking flock and the seconds they took, "lease" datagrams sent, leases handed over to a waiter seen
        # on WAITERS and given up when asked.
        def lock_stats = @lock_stats.dup

        private

        def start_write_lease
          @leased = false # this store holds the flock
          @lease_fresh = false # taken since the last append: others may have appended
          @leased_at = 0.0
          @gave_lease_at = -1.0
          @step_back = STEP_BACK
          @used_at = 0.0
          @contended_at = -CONTENDED # when another writer was last seen
          @looked_at = 0.0 # when a lease holder last looked at WAITERS
          @waiters&.close
          @waiters = nil
          @waiter = nil # [thread, since, warned] while an append waits in a blocking flock
          @wait_mutex = Mutex.new
          @watchdog = nil
          @asked_at = -WATCH
          @ticks = 0
          @lock_stats = {leases: 0, waits: 0, waited: 0.0, asks: 0, handed: 0, given: 0}
        end

        # Runs the block holding the write lock; under @lock.
        def locked
          take_lease unless @leased
          yield
        ensure
          after_append
        end

        def contended? = now - @contended_at < CONTENDED

        # Keeps the lease, and hands it over to a blocked writer once held MIN_HOLD: it looks every LOOK_EVERY
        # while others write, else every LOOK_QUIET. (File#flock lets other threads of this process have the
        # GVL, so a look costs a thread switch when several publish; a waiter that saw no contention asks
        # with a datagram besides.)
        def after_append
          return unless @leased # (the wait for it failed)
          # One clock read (not `now`: a method call less), after every append; Wakeup#notify takes it.
          @used_at = t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return drop_lease unless @wakeup&.listening?
          return if t - @leased_at < MIN_HOLD
          look_for_waiters if t - @looked_at >= ((t - @contended_at < CONTENDED) ? LOOK_EVERY : LOOK_QUIET)
        end

        # A lease holder publishing in a loop hears askers only between its appends, when its listener gets
        # the GVL; a writer blocked on the lock holds a shared flock on WAITERS, seen here in two syscalls.
        def look_for_waiters
          @looked_at = @used_at
          waiters = (@waiters ||= @directory.open_waiters) or return
          return waiters.flock(File::LOCK_UN) if waiters.flock(File::LOCK_EX | File::LOCK_NB)
          @lock_stats[:handed] += 1
          @contended_at = @gave_lease_at = @used_at
          drop_lease
        end

        # A store that just gave its lock up keeps away for @step_back first, so the writer it gave it to (woken
        # by the kernel, not yet running) gets it. Taking it back anyway means that writer was not scheduled in
        # time (a loaded machine): the next step back is twice as long, up to STEP_BACK_MAX, so a busy writer
        # cannot keep the lock from a slow one; a handover that worked halves it again.
        def take_lease
          check_directory_for_writing if @wakeup # (Replacement; not while opening) may reopen another directory
          gave = @gave_lease_at > @leased_at && now - @gave_lease_at < STEP_BACK_MAX # (a while ago: no one waits)
          wait = @gave_lease_at + @step_back - now
          sleep wait if gave && wait > 0
          if @write_lock.flock(File::LOCK_EX | File::LOCK_NB)
            @step_back = [@step_back * 2, STEP_BACK_MAX].min if gave
          else
            @step_back = [@step_back / 2, STEP_BACK].max if gave
            ask = !contended? # a holder that saw contention looks at WAITERS; one that did not is asked
            @contended_at = now
            wait_for_lock(ask: ask)
          end
          hold
          # Its listener is to drop the lease once unused for IDLE: it must know it has one. (Not needed
          # when :always drops it after the batch, others writing: GroupCommit#commit.)
          @wakeup&.nudge unless @fsync == :always && contended?
        end

        def hold
          @lock_stats[:leases] += 1
          @ticks = 0
          @leased = true
          @lease_fresh = true
          @leased_at = now
        end

        def ask_for_lease
          @lock_stats[:asks] += 1
          @asked_at = now
          Wakeup.ask_for_lease(@directory.join("wakeup"), except: (@wakeup if @wakeup&.listening?))
        end

        # Waits in a blocking flock(LOCK_EX), holding a shared flock on WAITERS so a lease holder sees it, with
        # the watchdog watching. A holder that is not appending does not look at WAITERS: `ask` (no contention
        # seen lately), or WAITERS not taken, sends it a datagram first.
        def wait_for_lock(ask:)
          return poll_for_lock unless @wakeup&.listening?
          @lock_stats[:waits] += 1
          start_watchdog
          waiters = (@waiters ||= @directory.open_waiters)
          seen = waiters&.flock(File::LOCK_SH | File::LOCK_NB)
          ask_for_lease if ask || !seen
          begin
            started = now
            @wait_mutex.synchronize { @waiter = [Thread.current, started, false] }
            # The listener raises TimeoutError in this thread only while @waiter is set. Arriving just as the
            # flock returned, it is raised when this block ends, before anything is written.
            Thread.handle_interrupt(TimeoutError => :on_blocking) do
              @write_lock.flock(File::LOCK_EX)
              @wait_mutex.synchronize { @waiter = nil }
            end
            @lock_stats[:waited] += now - started
          rescue TimeoutError
            @write_lock.flock(File::LOCK_UN) # it may have come with the lock
            raise
          end
        ensure
          @wait_mutex.synchronize { @waiter = nil }
          waiters.flock(File::LOCK_UN) if seen
        end

        # Without a listener (opening, closing, no wakeup socket): LOCK_NB with a backoff, asking every ASK_EVERY.
        def poll_for_lock
          wait = POLL
          asked_at = nil
          started = now
          warned = false
          until @write_lock.flock(File::LOCK_EX | File::LOCK_NB)
            if asked_at.nil? || now - asked_at > ASK_EVERY
              ask_for_lease
              asked_at = now
            end
            warned = waited_too_long(now - started, warned)
            sleep wait
            wait = [wait * 2, POLL_MAX].min
          end
        end

        # Raises once the wait reached lock_timeout; warns once past WAIT_WARN. Returns whether it warned.
        def waited_too_long(waited, warned)
          raise TimeoutError, timed_out_message if waited >= @lock_timeout
          return warned if warned || waited < WAIT_WARN
          Herald.logger.warn "#{@dir}: waiting for the log's write lock, held by #{lock_holder}"
          true
        end

        def timed_out_message
          "#{@dir}: the log's write lock has been held by #{lock_holder} for #{@lock_timeout} s " \
            "(a stopped or hung process?); nothing was written"
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

        # Called by the Wakeup listener after every wait: drops a lease unused for IDLE (IDLE_CONTENDED while
        # others write), and returns how long the listener may wait before it looks again (nil: as long as it likes).
        def lease_tick
          return nil unless @leased
          limit = contended? ? IDLE_CONTENDED : IDLE
          idle = now - @used_at
          if idle < limit
            # Still in use while others write: the lease is handed over through WAITERS; look again only
            # after BUSY_TICK (a tick every IDLE_CONTENDED took the GVL from the publishing thread 1,000 times
            # a second). The first tick after a lease is taken comes after IDLE_CONTENDED, so a process that
            # published once keeps the others waiting that long, not BUSY_TICK.
            return limit - idle unless contended? && (@ticks += 1) > 1
            return [limit - idle, BUSY_TICK].max
          end
          @lock.synchronize do
            drop_lease if @leased && !ForkTracker.forked?(@pid) && now - @used_at >= limit
          end
          nil
        rescue IOError
          nil # closed meanwhile
        end

        # A thread of the store's that watches its blocked writers (the listener cannot: it may itself wait for
        # @lock, which the blocked writer holds). Started by the first blocking wait; it stops after a while
        # without one, and in a forked child (threads do not survive fork) the next wait starts another.
        def start_watchdog
          return if @watchdog&.alive?
          @watchdog = Thread.new do
            idle = 0
            while !@closed && idle < WATCHDOG_IDLE
              sleep WATCH
              idle = watch_waiter ? 0 : idle + 1
            end
          end
          @watchdog.name = "herald-log-lock-watch"
        end

        # Warns about a writer blocked past WAIT_WARN, asks again for the lease (a datagram can be lost), and
        # interrupts the wait at lock_timeout. Returns whether a writer was waiting.
        def watch_waiter
          @wait_mutex.synchronize do
            waiter = @waiter or return false
            thread, since, warned = waiter
            waited = now - since
            if waited >= @lock_timeout
              @waiter = nil
              thread.raise(TimeoutError, timed_out_message)
            elsif waited >= WAIT_WARN && !warned
              waiter[2] = true
              Herald.logger.warn "#{@dir}: waiting for the log's write lock, held by #{lock_holder}"
            end
          end
          ask_again
          true
        end

        # While a writer is blocked: every WATCH.
        def ask_again
          return unless @waiter && now - @asked_at >= WATCH
          ask_for_lease
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
          while (wait = @lock.synchronize { hand_over })
            sleep wait
          end
        rescue IOError
          nil # closed meanwhile
        end

        # Under @lock: gives the lease up, or returns how long to keep it first (MIN_HOLD, unless it is not
        # being used: a process that published once a moment ago keeps nobody waiting).
        def hand_over
          return unless @leased && !ForkTracker.forked?(@pid)
          held = now - @leased_at
          return MIN_HOLD - held if held < MIN_HOLD && now - @used_at < UNUSED
          drop_lease
          @lock_stats[:given] += 1
          @contended_at = @gave_lease_at = now
          nil
        end

        def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end
  end
end
