# frozen_string_literal: true

require "json"
require "open3"

module Herald
  class Web
    # A Rack app for load balancers and Kubernetes probes: 200 when Herald is healthy, 503 with the reasons
    # when not, as JSON either way:
    #
    #   {"status":"ok","reasons":[],"checks":{"store":"ok","disk_free_bytes":..,"subscribers":{"Mailer":{..}}}}
    #
    #   run Herald::Web::Health.new(disk_free_min: 512 * 1024**2, lag_max: 10_000, lag_seconds_max: 300)
    #
    # What makes it 503:
    #   - the store does not answer (a Redis or PostgreSQL server away, a log that refuses writes);
    #   - the free disk under the log's directory (data_dir, or `dir:`) is below disk_free_min bytes;
    #   - a deferred subscriber is more than lag_max messages or lag_seconds_max seconds behind (its cursor
    #     in the store: right whichever process runs it);
    #   - a subscriber's lease is stuck: messages wait after its cursor and the cursor has not moved for
    #     stuck_after seconds (its worker hangs in a handler, or no process runs it). Seen across calls of
    #     this object: the first check after a start never reports it.
    # A threshold left nil is not checked. Thresholds may be changed on a running instance (attr_accessor).
    class Health
      attr_accessor :disk_free_min, :lag_max, :lag_seconds_max, :stuck_after

      def initialize(bus: nil, disk_free_min: nil, lag_max: nil, lag_seconds_max: nil, stuck_after: nil, dir: nil, subscribers: nil)
        @bus = bus
        @disk_free_min = disk_free_min
        @lag_max = lag_max
        @lag_seconds_max = lag_seconds_max
        @stuck_after = stuck_after
        @dir = dir
        @subscribers = subscribers&.map(&:to_s)&.freeze
        @lock = Mutex.new
        @moved = {} # subscriber => [cursor, when it was first seen there]
      end

      def call(_env)
        result = check
        [(result[:status] == "ok") ? 200 : 503, {"content-type" => "application/json", "cache-control" => "no-store"}, [JSON.generate(result)]]
      end

      # {status: "ok" | "fail", reasons: [String], checks: {...}}
      def check
        reasons = []
        checks = {}
        store = bus.store
        begin
          store.last_global_id
          checks[:store] = "ok"
        rescue => e
          checks[:store] = reasons.push("store unreachable: #{e.class}: #{e.message}").last
          return {status: "fail", reasons: reasons, checks: checks}
        end
        check_disk(store, reasons, checks)
        check_subscribers(store, reasons, checks)
        {status: reasons.empty? ? "ok" : "fail", reasons: reasons, checks: checks}
      end

      # Bytes available to an unprivileged user on the file system holding `dir` (POSIX `df -P`: Linux, macOS).
      def self.free_bytes(dir)
        out, status = Open3.capture2("df", "-Pk", "--", dir.to_s)
        raise Herald::Error, "df -Pk #{dir} failed: #{out}" unless status.success?
        fields = out.lines.last.to_s.match(/\s(\d+)\s+(\d+)\s+(\d+)\s+\d+%\s/) or raise Herald::Error, "df -Pk #{dir}: unexpected output #{out.inspect}"
        Integer(fields[3], 10) * 1024
      end

      private

      def bus = @bus || Herald.bus

      def check_disk(store, reasons, checks)
        dir = @dir || store.data_dir
        return unless dir && @disk_free_min
        free = Health.free_bytes(dir)
        checks[:disk_free_bytes] = free
        reasons << "disk: #{free} bytes free under #{dir}, below disk_free_min #{@disk_free_min}" if free < @disk_free_min
      rescue Herald::Error => e
        reasons << "disk: #{e.message}"
      end

      def check_subscribers(store, reasons, checks)
        names = @subscribers || Events::Lag.names
        return if names.empty?
        checks[:subscribers] = Events::Lag.all(store, names).to_h do |lag|
          reasons.concat(lag_reasons(lag))
          [lag.subscriber, {cursor: lag.cursor, lag_messages: lag.messages, lag_seconds: lag.seconds.round(3)}]
        end
      rescue Herald::Error => e
        reasons << "subscribers: #{e.class}: #{e.message}"
      end

      def lag_reasons(lag)
        name = lag.subscriber
        found = []
        found << "#{name}: #{lag.messages} messages behind, over lag_max #{@lag_max}" if @lag_max && lag.messages > @lag_max
        found << "#{name}: #{lag.seconds.round(3)} s behind, over lag_seconds_max #{@lag_seconds_max}" if @lag_seconds_max && lag.seconds > @lag_seconds_max
        still = stuck_for(lag)
        found << "#{name}: lease stuck, its cursor #{lag.cursor} has not moved for #{still.round(1)} s with #{lag.messages} messages after it" if still
        found
      end

      # Seconds the cursor has stood still with messages waiting, when over stuck_after; nil otherwise.
      def stuck_for(lag)
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @lock.synchronize do
          seen = @moved[lag.subscriber]
          @moved[lag.subscriber] = seen = [lag.cursor, now] if seen.nil? || seen[0] != lag.cursor || lag.messages == 0
          still = now - seen[1]
          (@stuck_after && lag.messages > 0 && still > @stuck_after) ? still : nil
        end
      end
    end
  end
end
