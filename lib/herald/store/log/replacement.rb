# frozen_string_literal: true

module Herald
  module Store
    class Log
      # A log directory replaced under a running store: emptied and recreated (a dev store wiped), or a
      # backup restored in its place. The store's open files still point at the deleted ones, so without
      # this it kept serving the deleted messages, never saw the new ones (appends elsewhere poke the
      # new directory's wakeup sockets), and its own appends went into deleted files: acknowledged, lost.
      #
      # The sign is META: written once when a directory is created, so another file under that name (or
      # none) means another directory. Looked at (one stat) by the wakeup listener every CHECK_EVERY, and by
      # a writer whenever it takes the write lease (before anything is written; a writer keeping the
      # lease in a loop is covered by the listener). Nothing is looked at per append.
      #
      # A replaced directory is a reset: the store lets go of the old files, opens the new directory
      # (recovery, its epoch and its ids) and tells its readers: waiters and watchers are woken,
      # `known_epoch` changes (Bus subscriptions, the Rack reactor and reply cache, event workers start again
      # from the new directory), and `on_reset.(old_epoch, new_epoch)` runs on a thread of its own. Ids are
      # the new directory's: other processes may have appended there already, and they learn of no floor
      # this process could set (Redis keeps one in the server); the epoch is what tells readers that ids
      # started over. A copy of this same log put back (a backup restored: the same epoch) gets a new epoch,
      # written to META so that every process sees the same reset: what it holds differs from what readers
      # were shown (messages gone, ids that may come again).
      module Replacement
        CHECK_EVERY = 0.25 # seconds between two looks by the listener (it wakes at least every Wakeup::POLL)

        # How many times this store found its directory replaced (tests, monitoring).
        attr_reader :resets

        private

        # What identifies the directory's META file: nil when there is none (yet). The inode alone does not:
        # a file system hands a deleted file's inode number to the next file created, often the new META.
        def meta_identity
          stat = File.stat(@directory.join("META"))
          [stat.dev, stat.ino, stat.ctime.tv_sec, stat.ctime.tv_nsec]
        rescue SystemCallError
          nil
        end

        # The listener's look, at most every CHECK_EVERY: acts only on a META that is there and not ours (an
        # emptied directory nobody reopened yet holds nothing new to read; a writer recreates it).
        def check_directory
          now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return if now - @directory_checked_at < CHECK_EVERY
          @directory_checked_at = now
          identity = meta_identity
          return if identity.nil? || identity == @meta_identity
          @lock.synchronize { reopen_replaced if !@closed && !ForkTracker.forked?(@pid) && meta_identity != @meta_identity }
        end

        # A writer's look before it takes the lease (under @lock): META gone or not ours means the files it
        # holds are deleted, and a record written there would be lost.
        def check_directory_for_writing
          reopen_replaced unless @closed || meta_identity == @meta_identity
        end

        # A writer keeping the lease found its directory's files gone mid-append (the listener had not looked
        # yet): the new directory is opened, and LogReplacedError says nothing was stored. Any other missing
        # file is a StoreError, never the OS's own error.
        def replaced_while_writing!(error)
          raise StoreError, "#{@dir}: #{error.message} while publishing" if @closed || meta_identity == @meta_identity
          reopen_replaced
          raise LogReplacedError, "#{@dir} was replaced while a publish was being written: nothing of it was stored"
        end

        # Under @lock. Lets go of the old directory's files and opens the new one; see the module comment.
        # A file appearing or vanishing meanwhile (EEXIST, ENOENT) means the directory is being replaced again
        # (a process recreating it): what is there then is opened, up to `tries` times.
        def reopen_replaced(tries: 3)
          old_epoch = (@replaced_from ||= @epoch) # kept until a reopen succeeds (retried at the next look)
          let_go_of_directory
          open_directory
          @reservation = @write_lock && Reservation.new(@directory)
          if @write_lock
            locked do
              recover
              new_epoch(old_epoch)
            end
          else
            recover
          end
          @meta_identity = meta_identity
          @replaced_from = nil
          @wakeup = new_wakeup
          announce_reset(old_epoch)
        rescue Errno::EEXIST, Errno::ENOENT => e
          retry if (tries -= 1) > 0
          raise StoreError, "#{@dir} kept changing while it was being opened again (#{e.message}): publish again"
        ensure
          @wakeup ||= new_wakeup # failed (the new META damaged, say): a listener looks again, as does the next writer
        end

        # The old directory's files: they are deleted, nothing in them needs saving or giving back. A watch
        # socket an event loop selects on stays open (it is that loop's to cancel); the loop is woken
        # through the new listener meanwhile. The old segments stay open until the store closes: a group
        # commit's leader may be in fdatasync on one, outside the lock, and closing it under that thread
        # raised IOError ("stream closed in another thread") out of its publish once the commit was done.
        def let_go_of_directory
          @wakeup&.retire
          @wakeup = nil
          (@retired_segments ||= []).concat(@segments)
          drop_lease if @write_lock && !@write_lock.closed?
          [@write_lock, @waiters, @reservation].each { |f| f&.close }
        rescue IOError, SystemCallError
          nil
        end

        # Under the new directory's write lock, after recovery: a copy of this log gets an epoch of its own.
        def new_epoch(old_epoch)
          return unless @epoch == old_epoch
          @epoch = Store.new_epoch
          @directory.write_atomically("META", JSON.generate({"format" => 1, "epoch" => @epoch, "segment_bytes" => @segment_bytes}))
        end

        def announce_reset(old_epoch)
          @resets += 1
          @corrupt_records = []
          @appended.broadcast
          @watchers.call
          new_epoch = @epoch
          Thread.new { @on_reset.call(old_epoch, new_epoch) }.name = "herald-log-reset"
        end
      end
    end
  end
end
