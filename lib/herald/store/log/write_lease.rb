# frozen_string_literal: true

module Herald
  module Store
    class Log
      # The write lock (an flock on LOCK) kept between appends: a lease. Taking and dropping the flock
      # around every append, and asking the file's size (others may have appended meanwhile), cost three
      # syscalls of the four a publish made; a process that keeps the lock knows nobody appended since its
      # last write, so an append is one pwrite. docs/log.md has the design and its figures.
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
      module WriteLease
        MIN_HOLD = 0.002
        STEP_BACK = 0.0005
        ASK_EVERY = 0.005
        POLL = 0.0001 # first wait between LOCK_NB attempts; doubles up to POLL_MAX
        POLL_MAX = 0.002

        private

        def start_write_lease
          @leased = false # this store holds the flock
          @lease_fresh = false # taken since the last append: others may have appended
          @leased_at = 0.0
          @gave_lease_at = -STEP_BACK
        end

        # Runs the block holding the write lock; under @lock.
        def locked
          take_lease unless @leased
          yield
        ensure
          drop_lease unless @wakeup&.listening?
        end

        def take_lease
          step_back = @gave_lease_at + STEP_BACK - now
          sleep step_back if step_back > 0
          wait = POLL
          asked_at = nil
          until @write_lock.flock(File::LOCK_EX | File::LOCK_NB)
            if asked_at.nil? || now - asked_at > ASK_EVERY
              Wakeup.ask_for_lease(@directory.join("wakeup"), except: (@wakeup if @wakeup&.listening?))
              asked_at = now
            end
            sleep wait
            wait = [wait * 2, POLL_MAX].min
          end
          @leased = true
          @lease_fresh = true
          @leased_at = now
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
