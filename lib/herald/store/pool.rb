# frozen_string_literal: true

module Herald
  module Store
    # A small thread-safe connection pool for the networked stores. Connections are made on demand, up to
    # `size`; a thread waits for a free one. A connection whose operation failed with a lost connection
    # is closed and forgotten instead of being returned, and so is an idle one that `alive` finds dead at
    # checkout (the server restarted or ended the session while it sat in the pool): a publish must not be
    # the call that finds out. After a fork the child drops (never closes) the inherited connections:
    # closing them would talk on the parent's sockets.
    class Pool
      def initialize(size:, timeout:, connect:, close:, abandon:, broken:, alive: ->(_) { true })
        raise InvalidArgumentError, "pool size must be a positive Integer, got #{size.inspect}" unless size.is_a?(Integer) && size > 0
        @size = size
        @timeout = timeout
        @connect = connect
        @close = close
        @abandon = abandon
        @broken = broken
        @alive = alive
        @lock = Mutex.new
        @available = ConditionVariable.new
        @idle = []
        @all = [] # every open connection, checked out or not: a fork must abandon them all
        @created = 0
        @pid = ForkTracker.pid
      end

      def with
        conn = checkout
        begin
          result = yield conn
        rescue Exception => e # standard:disable Lint/RescueException
          if @broken.call(e, conn)
            discard(conn)
            conn = nil
          end
          raise
        ensure
          checkin(conn) if conn
        end
        result
      end

      # Forgets every connection (after a fork: abandoned, not closed). Called by the store's after_fork.
      def after_fork
        @lock = Mutex.new
        @available = ConditionVariable.new
        @all.each { |c| @abandon.call(c) }
        @idle = []
        @all = []
        @created = 0
        @pid = ForkTracker.pid
      end

      def close
        @lock.synchronize do
          @idle.each { |c| @close.call(c) }
          @created -= @idle.size
          @all -= @idle
          @idle.clear
        end
      end

      private

      def checkout
        while (conn = take)
          return conn if @alive.call(conn)
          discard(conn)
        end
        connect_one
      end

      # An idle connection, or nil when this thread may open a new one. (No `return` from inside the
      # block: a non-local return unwinds like an exception, half of a checkout's cost.)
      def take
        after_fork if ForkTracker.forked?(@pid)
        @lock.lock
        begin
          deadline = nil
          until (conn = @idle.pop)
            if @created < @size
              @created += 1
              break
            end
            deadline ||= Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout
            left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
            raise ConnectionError, "no free connection in #{@timeout}s: raise the store's pool: size (now #{@size})" if left <= 0
            @available.wait(@lock, left)
          end
          conn
        ensure
          @lock.unlock
        end
      end

      def connect_one
        conn = @connect.call
        @lock.synchronize { @all << conn }
        conn
      rescue Exception # standard:disable Lint/RescueException
        @lock.synchronize do
          @created -= 1
          @available.signal
        end
        raise
      end

      def checkin(conn)
        return if ForkTracker.forked?(@pid) # made before a fork: belongs to the parent
        @lock.synchronize do
          @idle.push(conn)
          @available.signal
        end
      end

      def discard(conn)
        @close.call(conn)
      rescue
        nil
      ensure
        @lock.synchronize do
          @all.delete(conn)
          @created -= 1
          @available.signal
        end
      end
    end
  end
end
