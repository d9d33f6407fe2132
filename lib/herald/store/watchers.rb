# frozen_string_literal: true

module Herald
  module Store
    # Store#watch's callbacks: the shortest way from an append to a reader that keeps its own cursor (the
    # event loop of Herald::Rack::Reactor). The thread that learned of new records (the appending thread;
    # for the Log also the thread that read another process's records) calls every watcher right away, so
    # the reader needs no thread in between: before, a message reached the event loop through the bus's
    # dispatcher thread (and, from another process, the log's listener thread as well), one OS wake-up and
    # one GVL hand-off each, which on busy cores cost milliseconds apiece.
    #
    # A callback must be cheap and must not block (NIO::Selector#wakeup): it runs on the appending thread,
    # inside the store's lock for records read from other processes. It says only "something is new": the
    # watcher reads the store after its own cursor (global_backlog), so a wake-up it misses while reading
    # is never a message it misses. Memory and Log have watchers; the networked stores do not (reading them
    # is a network round trip, which an event loop must not wait for: the bus's dispatcher does it).
    class Watchers
      # One registration. #io (Log only): readable when another process appended; the watcher calls
      # #readable then (on its own thread), which reads those records in and runs the callbacks.
      class Watch
        attr_reader :callback, :pid, :io

        def initialize(callback, pid, watchers, io: nil, on_readable: nil, on_cancel: nil)
          @callback = callback
          @pid = pid
          @watchers = watchers
          @io = io
          @on_readable = on_readable
          @on_cancel = on_cancel
        end

        def readable = @on_readable&.call

        def cancel
          @watchers.remove(self)
          @on_cancel&.call
          @on_cancel = nil
        end
      end

      def initialize
        @lock = Mutex.new
        @list = [].freeze # replaced, never changed: #call reads it without the lock
      end

      def add(callback, **options)
        watch = Watch.new(callback, ForkTracker.pid, self, **options)
        @lock.synchronize { @list = [*@list, watch].freeze }
        watch
      end

      def remove(watch)
        @lock.synchronize { @list = (@list - [watch]).freeze }
      end

      def empty? = @list.empty?

      # A forked child inherits its parent's watchers (and their event loops' pipes): those are skipped.
      def call
        list = @list
        return if list.empty?
        pid = ForkTracker.pid
        list.each do |watch|
          next unless watch.pid == pid
          begin
            watch.callback.call
          rescue => e
            Herald.logger.warn "store watcher failed: #{e.class}: #{e.message}"
          end
        end
      end
    end
  end
end
