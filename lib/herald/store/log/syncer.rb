# frozen_string_literal: true

module Herald
  module Store
    class Log
      # When appended records reach the disk.
      #   :always    append returns after fdatasync; concurrent appenders share one (GroupCommit).
      #   :interval  a background thread syncs at most every INTERVAL seconds when something was written.
      #   :never     the OS decides.
      # A failed fsync is fatal for the store (the kernel may already have dropped the dirty pages, so a
      # retry would report success for lost data): every later append raises DurabilityError.
      class Syncer
        MODES = %i[always interval never].freeze
        INTERVAL = 0.1

        attr_reader :mode, :failure

        def initialize(mode, &current_segment)
          raise InvalidArgumentError, "Unknown fsync mode #{mode.inspect}, expected one of #{MODES.inspect}" unless MODES.include?(mode)
          @mode = mode
          @current_segment = current_segment
          @written = 0 # how many writes so far (read by the interval thread)
          @failure = nil
          @thread = start_interval_thread if mode == :interval
        end

        # Called by the appender (under the store lock) after a write.
        def written
          @written += 1
        end

        # Makes everything written to `segment` durable now.
        def sync_now(segment)
          return unless segment # (none while the store opens a replaced directory)
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          segment.sync
          Metrics::FSYNC_DURATION.observe(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
        rescue IOError
          nil # the segment was closed (deleted, or the store closed) after a final sync
        rescue SystemCallError => e
          @failure = DurabilityError.new("fsync of #{segment.path} failed (#{e.message}): records may be lost; " \
            "this store refuses further writes. Check the disk, then reopen the store.")
          raise @failure
        end

        def check!
          raise @failure if @failure
        end

        def stop
          @thread&.kill
          @thread = nil
        end

        private

        def start_interval_thread
          Thread.new do
            Thread.current.name = "herald-log-fsync"
            synced = 0
            loop do
              sleep INTERVAL
              target = @written
              next if target == synced
              sync_now(@current_segment.call)
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
