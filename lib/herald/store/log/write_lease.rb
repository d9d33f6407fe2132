# frozen_string_literal: true

module Herald
  module Store
    class Log
      # The write lock (an flock on LOCK), in two modes. docs/log.md has the design and its figures.
      #
      # A lease, while one process writes alone: the flock is kept between appends. Taking and dropping it
      # around every append, and asking the file's size (others may have appended meanwhile), cost three
      # syscalls of the four a publish made; a process that keeps the lock knows nobody appended since its
      # last write, so an append is one write.
      #
      # Turns, while several processes write at once (a Puma cluster whose workers all publish): each append
      # takes the flock and drops it, and a writer that finds it taken waits in a blocking flock(LOCK_EX): the
      # kernel wakes it when the lock is dropped, with no datagram and no polling. Passing a lease around
      # instead cost every few appends a datagram, a listener wakeup, a poll sleep and a catch-up, and while
      # one process held it the others' publishes all waited: two processes got less done than one.
      # Contention is seen by a writer whose flock(LOCK_NB) fails, by a holder asked for its lease, and by a
      # lease holder that looks at WAITERS (a blocked writer holds a shared flock on it) every LOOK_EVERY; the
      # store takes turns until TURNS passed without any of those, then keeps a lease again.
      #
      # Asking a lease holder: a writer that finds the lock taken while it kept leases sends a "lease" datagram
      # to every open store's wakeup socket (Wakeup); the holder's listener thread gives the lock up between
      # two appends once it held it MIN_HOLD. Whoever takes the lock after someone else held it reads what was
      # appended meanwhile, and cuts a dead writer's torn tail, before it appends: as before, ids follow on
      # densely, in commit order.
      #
      # The kernel frees the flock when its holder dies (kill -9 included). A store without a listening wakeup
      # socket cannot hear an asker and has no thread to watch its waits: it drops the lock after every append
      # and waits for it by polling (LOCK_NB with a backoff), as before.
      #
      # A holder that cannot answer (stopped by SIGSTOP or a suspended console, hung) would keep everyone else
      # from writing. So the listener drops a lease nobody used for IDLE, and watches a writer blocked on the
      # lock: it warns at WAIT_WARN (naming the holder) and after `lock_timeout` seconds interrupts the wait
      # with TimeoutError instead of letting it hang.
      module WriteLease
        MIN_HOLD = 0.002
        STEP_BACK = 0.0005
        ASK_EVERY = 0.005
        POLL = 0.0001 # first wait between LOCK_NB attempts (no listener); doubles up to POLL_MAX
        POLL_MAX = 0.002
        IDLE = 0.02
        WAIT_WARN = 1.0
        CONTENDED = 0.05 # for this long after another writer was seen, the lease is handed over on sight
        HOLD = 0.002 # a lease is held at least this long when others wait (a run of appends per handoff)
        LOOK_EVERY = 0.0005 # how often a lease holder past HOLD looks for blocked writers (WAITERS)
        IDLE_CONTENDED = 0.001 # a lease unused this long is dropped when others wrote recently
        WATCH = 0.1 # how often a blocked writer is looked at (start_watchdog)
        WATCHDOG_IDLE = 100 # WATCH periods without a blocked writer before the watchdog thread stops

        # What this store did for the write lock since it opened (tests, benchmarks): appends that held a
        # lease taken before, turns, waits in a blocking flock, datagrams asking for the lease, leases given up.
        def lock_stats = @lock_stats.dup

        private

        def start_write_lease
          @leased = false # this store holds the flock
          @lease_fresh = false # taken since the last append: others may have appended
          @leased_at = 0.0
          @gave_lease_at = -STEP_BACK
          @used_at = 0.0
          @contended_at = -CONTENDED # when another writer was last seen
          @looked_at = 0.0 # when a lease holder last looked at WAITERS
          @waiters&.close
          @waiters = nil
          @waiter = nil # [thread, since, warned] while an append waits in a blocking flock
          @wait_mutex = Mutex.new
          @watchdog = nil
          @asked_at = -WATCH
          @lock_stats = {kept: 0, leases: 0, waits: 0, asks: 0, given: 0, handed: 0}
        end

        # Runs the block holding the write lock; under @lock.
        def locked
          if @leased
            @lock_stats[:kept] += 1
          else
            take_lease
          end
          yield
        ensure
          after_append
        end

        def contended? = now - @contended_at < CONTENDED

        # Keeps the lease, and hands it over to a blocked writer once held HOLD (looking every LOOK_EVERY).
        def after_append
          return drop_lease unless @wakeup&.listening?
          @used_at = now
          look_for_waiters if @used_at - @leased_at >= HOLD && @used_at - @looked_at >= LOOK_EVERY
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

        def take_lease
          step_back = @gave_lease_at + STEP_BACK - now
          sleep step_back if step_back > 0
          unless @write_lock.flock(File::LOCK_EX | File::LOCK_NB)
            ask = !contended? # a holder that saw contention looks at WAITERS; one that did not is asked
            @contended_at = now
            wait_for_lock(ask: ask)
          end
          hold
          @wakeup&.nudge # its listener is to drop the lease once unused for IDLE: it must know it has one
        end

        def hold
          @lock_stats[:leases] += 1
          @leased = true
          @lease_fresh = true
          @leased_at = now
        end

        def ask_for_lease
          @lock_stats[:asks] += 1
          @asked_at = now
          Wakeup.ask_for_lease(@directory.join("wakeup"), except: (@wakeup if @wakeup&.listening?))
        end

        # Waits in a blocking flock(LOCK_EX), holding a shared flock on WAITERS so a lease holder sees it, and
        # with the store's listener watching (lease_tick). A lease holder may not look (it is idle, or keeps
        # its lease from before): `ask` sends it a datagram first.
        def wait_for_lock(ask:)
          return poll_for_lock unless @wakeup&.listening?
          @lock_stats[:waits] += 1
          start_watchdog
          waiters = (@waiters ||= @directory.open_waiters)
          seen = waiters&.flock(File::LOCK_SH | File::LOCK_NB)
          ask_for_lease if ask || !seen
          begin
            @wait_mutex.synchronize { @waiter = [Thread.current, now, false] }
            # The listener raises TimeoutError in this thread only while @waiter is set. Arriving just as the
            # flock returned, it is raised when this block ends, before anything is written.
            Thread.handle_interrupt(TimeoutError => :on_blocking) do
              @write_lock.flock(File::LOCK_EX)
              @wait_mutex.synchronize { @waiter = nil }
            end
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

        # Called by the Wakeup listener after every wait: watches a blocked writer, drops a lease unused for
        # IDLE, and returns how long the listener may wait before it looks again (nil: as long as it likes).
        def lease_tick
          return nil unless @leased
          idle_limit = contended? ? IDLE_CONTENDED : IDLE
          idle = now - @used_at
          return idle_limit - idle if idle < idle_limit
          @lock.synchronize do
            drop_lease if @leased && !ForkTracker.forked?(@pid) && now - @used_at >= idle_limit
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
            until @closed || (idle += 1) > WATCHDOG_IDLE
              sleep WATCH
              idle = 0 if watch_waiter
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

        # While a writer is blocked: every WATCH at most (the listener also runs after every poke).
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
        # the store's lock: a lease taken while this thread waited for the lock is a new one. Being asked is
        # contention: the store takes turns from then on.
        def give_lease
          while (wait = @lock.synchronize { hand_over })
            sleep wait
          end
        rescue IOError
          nil # closed meanwhile
        end

        # Under @lock: gives the lease up, or returns how long to keep it first (MIN_HOLD).
        def hand_over
          return unless @leased && !ForkTracker.forked?(@pid)
          held = now - @leased_at
          return MIN_HOLD - held if held < MIN_HOLD
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
