# frozen_string_literal: true

module Herald
  module Store
    class Log
      # When appended records reach the disk.
      #   :always    append returns after fdatasync; concurrent appenders share one (group commit): the first
      #              waiter becomes the leader and syncs everything written so far, the others wait for it.
      #   :interval  a background thread syncs at most every INTERVAL seconds when something was written.
      #   :never     the OS decides.
      # A failed fsync is fatal for the store (the kernel may already have dropped the dirty pages, so a
      # retry would report success for lost data): every later append raises DurabilityError.
      class Syncer
        MODES = %i[always interval never].freeze
        INTERVAL = 0.1

        attr_reader :mode, :failure

        def initialize(mode, &current_segment)
          raise ArgumentError, "Unknown fsync mode #{mode.inspect}, expected one of #{MODES.inspect}" unless MODES.include?(mode)
          @mode = mode
          @current_segment = current_segment
          @lock = Mutex.new
          @synced_cond = ConditionVariable.new
          @written = 0 # sequence number of the last write
          @synced = 0
          @leader = false
          @failure = nil
          @thread = start_interval_thread if mode == :interval
        end

        # Called by the appender (under the store lock) after a record was written: its sequence number.
        def written = @lock.synchronize { @written += 1 }

        # Returns once write number `seq` is on disk (only waits in :always mode).
        def durable(seq)
          return unless @mode == :always
          @lock.synchronize do
            until @synced >= seq
              check!
              if @leader
                @synced_cond.wait(@lock)
              else
                lead
              end
            end
          end
        end

        # Everything written so far, now (before a segment is left behind for a new one).
        def sync_now(segment)
          target = @lock.synchronize { @written }
          fsync(segment)
          @lock.synchronize { @synced = target if target > @synced }
        end

        def check!
          raise @failure if @failure
        end

        def stop
          @thread&.kill
          @thread = nil
        end

        private

        # Runs with @lock held; syncs outside it so other appenders keep writing into the next batch.
        def lead
          @leader = true
          target = @written
          segment = @current_segment.call
          @lock.unlock
          begin
            fsync(segment)
          ensure
            @lock.lock
            @leader = false
            @synced = target if target > @synced && !@failure
            @synced_cond.broadcast
          end
        end

        def fsync(segment)
          segment.sync
        rescue IOError
          nil # the segment was closed (deleted or store closed) after its records were synced
        rescue SystemCallError => e
          @failure = DurabilityError.new("fsync of #{segment.path} failed (#{e.message}): records may be lost; " \
            "this store refuses further writes. Check the disk, then reopen the store.")
          raise @failure
        end

        def start_interval_thread
          Thread.new do
            Thread.current.name = "herald-log-fsync"
            synced = 0
            loop do
              sleep INTERVAL
              target = @lock.synchronize { @written }
              next if target == synced
              fsync(@current_segment.call)
              synced = target
            end
          rescue DurabilityError
            nil # kept in @failure: the next append raises it
          end
        end
      end
    end
  end
end
