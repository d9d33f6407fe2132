# frozen_string_literal: true

module Herald
  # Knows when this process is a fork of the one that opened a connection, so stores never share a
  # socket with their parent (a Puma cluster forks workers after boot). Ruby 3.1's `Process._fork` is
  # the one hook every fork goes through (Kernel#fork, Process.fork, IO.popen("-")): a prepend refreshes
  # the cached pid there and runs the registered after-fork callbacks in the child. Stores compare their
  # own pid with ForkTracker.pid before each use, which also covers Rubies without `_fork`.
  module ForkTracker
    # The pid, in an Array constant: a module's own instance variable is looked up in a table on every read,
    # and its attr_reader cost ~50 cache misses when run cold (stores check it on every read; the middleware's
    # reply cache on every poll, between Puma's requests), the constant's element a few.
    PID = [Process.pid]
    @callbacks = []
    @lock = Mutex.new

    class << self
      def pid = PID[0]

      def forked?(pid) = pid != PID[0]

      # Runs the block in every child after a fork (before the child's own code continues).
      def after_fork(&block)
        @lock.synchronize { @callbacks << block }
        block
      end

      def remove(block)
        @lock.synchronize { @callbacks.delete(block) }
      end

      # Called in the child by the Process._fork hook; call it yourself after a fork Ruby cannot see.
      def forked!
        PID[0] = Process.pid
        @callbacks.dup.each do |callback|
          callback.call
        rescue => e
          Herald.logger.warn "after_fork callback failed: #{e.class}: #{e.message}"
        end
      end
    end

    # The prepend on Process (the only monkey patch Herald makes).
    module ProcessHook
      def _fork
        pid = super
        ForkTracker.forked! if pid == 0
        pid
      end

      # Process.daemon forks through daemon(3), not _fork: only the child returns from it.
      def daemon(*)
        result = super
        ForkTracker.forked!
        result
      end
    end

    Process.singleton_class.prepend(ProcessHook) if Process.respond_to?(:_fork)

    # Without the hook, look the pid up on every check.
    singleton_class.define_method(:pid) { Process.pid } unless Process.respond_to?(:_fork)
  end
end
