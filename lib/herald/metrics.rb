# frozen_string_literal: true

module Herald
  # Counters and histograms of this process, kept in plain Ruby (no ActiveSupport, no Prometheus client) and
  # exported by Herald::Web::Metrics in Prometheus' text format. Written for the hot path: an increment or an
  # observation allocates nothing (Integers and Floats are immediates) and takes one uncontended Mutex.
  #
  # The figures are this process's (since it started or forked): Prometheus scrapes each process, or sums
  # what it scrapes (`sum without (instance)`). What the store knows (subscriber lag, log bytes) is read from
  # the store at scrape time, so it is right whichever process answers.
  #
  # Labels only with a bounded set of values: a label's values are fixed up front (transport), or capped
  # at MAX_LABEL_VALUES (subscriber names: classes in the app's code); past the cap they count as "other".
  # Never a channel: an app may have one per user or record.
  module Metrics
    MAX_LABEL_VALUES = 100
    OTHER = "other"

    # A monotonic counter, optionally with one label.
    #
    # The hot path (#add: a fixed label value by its index) takes no lock and allocates nothing: under CRuby's
    # GVL nothing else runs between reading an Array element and writing it back (the VM switches threads only
    # at method calls, returns and backward jumps; Array#[] and #[]= on an Integer index are single
    # instructions). A Mutex there cost 250 ns per increment, a tenth of a cached poll. Label values known only
    # at run time (subscriber names: #increment) go through a lock, capped at MAX_LABEL_VALUES.
    class Counter
      attr_reader :name, :help, :label

      def initialize(name, help, label: nil, values: nil)
        @name = name
        @help = help
        @label = label
        @lock = Mutex.new
        @fixed = (label ? values || [] : [nil]).freeze
        reset!
      end

      def type = "counter"

      # index: the label value's position in `values:` (0 without a label).
      def add(by = 1, index = 0) = @counts[index] += by

      def increment(by = 1, value = nil)
        index = @fixed.index(value) and return add(by, index)
        @lock.synchronize do
          key = (@dynamic.key?(value) || @dynamic.size + @fixed.size < MAX_LABEL_VALUES) ? value : OTHER
          @dynamic[key] = (@dynamic[key] || 0) + by
        end
      end

      # {label value => count} (nil => count without a label).
      def values = @fixed.zip(@counts.dup).to_h.merge(@lock.synchronize { @dynamic.dup })

      def value(label_value = nil) = values[label_value] || 0

      # Back to zero, and to the fixed label values only.
      def reset!
        @counts = Array.new(@fixed.size, 0)
        @dynamic = {}
      end

      # In a forked child: a fresh lock (the parent's may have been held by a thread the child lacks), from zero.
      def forked!
        @lock = Mutex.new
        reset!
      end

      def samples = values.map { |v, count| [name, v.nil? ? nil : {label => v}, count] }
    end

    # Observations in cumulative buckets (upper bounds in seconds), with their sum and count. Lock-free as
    # Counter#add: a scrape may see the sum of one observation more than the buckets show, never a lost one.
    class Histogram
      attr_reader :name, :help, :buckets

      def initialize(name, help, buckets:)
        @name = name
        @help = help
        @buckets = buckets.map(&:to_f).sort.freeze
        reset!
      end

      def type = "histogram"

      def observe(seconds)
        i = 0
        n = @buckets.size
        i += 1 while i < n && seconds > @buckets[i]
        @counts[i] += 1
        @sum += seconds # (a Float the VM keeps unboxed: durations are nowhere near its limits)
      end

      # Times the block.
      def time
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        yield
      ensure
        observe(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      end

      def count = @counts.sum

      attr_reader :sum

      def reset!
        @counts = Array.new(@buckets.size + 1, 0)
        @sum = 0.0
      end

      alias_method :forked!, :reset!

      def samples
        counts = @counts.dup
        sum = @sum
        total = 0
        rows = @buckets.each_with_index.map { |le, i| [bucket_name, {"le" => Metrics.number(le)}, total += counts[i]] }
        rows << [bucket_name, {"le" => "+Inf"}, total + counts.last]
        rows << ["#{name}_sum", nil, sum] << ["#{name}_count", nil, total + counts.last]
      end

      private

      def bucket_name = "#{name}_bucket"
    end

    # Parked HTTP clients: the reactors of this process, asked at scrape time.
    class ParkedClients
      def initialize
        @lock = Mutex.new
        @reactors = []
      end

      def track(reactor) = @lock.synchronize { @reactors += [reactor] }

      def untrack(reactor) = @lock.synchronize { @reactors -= [reactor] }

      # Reactors inherited from a parent process have no thread here: not counted.
      def count = @reactors.sum { |r| r.alive? ? r.size : 0 }
    end

    LATENCY_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10].freeze
    TRANSPORTS = %w[long_poll streaming sse subscriber cable].freeze
    # Indexes of DELIVERED's transports, for Counter#add.
    LONG_POLL, STREAMING, SSE, SUBSCRIBER, CABLE = TRANSPORTS.each_index.to_a

    PUBLISHED = Counter.new("herald_messages_published_total", "Messages this process appended (Bus#publish, Herald.publish_event)")
    DELIVERED = Counter.new("herald_messages_delivered_total", "Messages this process handed to a reader, by transport",
      label: "transport", values: TRANSPORTS)
    RETRIES = Counter.new("herald_retries_total", "Failed handler calls that will be retried, by deferred subscriber", label: "subscriber")
    DEAD_LETTERS = Counter.new("herald_dead_letters_total", "Events given up on (dead letters written), by deferred subscriber", label: "subscriber")
    PUBLISH_DURATION = Histogram.new("herald_publish_duration_seconds", "Time the store took to append a published message", buckets: LATENCY_BUCKETS)
    DELIVERY_LATENCY = Histogram.new("herald_delivery_latency_seconds",
      "From a message's append (the store's clock) to its bytes written to a parked HTTP client's socket, once per message fanned out", buckets: LATENCY_BUCKETS)
    FSYNC_DURATION = Histogram.new("herald_fsync_duration_seconds", "Time an fdatasync of the log's active segment took", buckets: LATENCY_BUCKETS)
    PARKED = ParkedClients.new

    ALL = [PUBLISHED, DELIVERED, RETRIES, DEAD_LETTERS, PUBLISH_DURATION, DELIVERY_LATENCY, FSYNC_DURATION].freeze

    # Transports as the reactor's connection modes name them.
    MODE_TRANSPORTS = {poll: LONG_POLL, chunked: STREAMING, sse: SSE}.freeze

    def self.delivered(mode, count) = DELIVERED.add(count, MODE_TRANSPORTS.fetch(mode))

    # Zeroes every counter and histogram of this process (tests).
    def self.reset! = ALL.each(&:reset!)

    # A forked child (a Puma worker) starts from zero, as a new process: summing the processes' figures
    # must not count the parent's twice. Fresh locks first: the parent's may have been held by a thread
    # the child does not have.
    ForkTracker.after_fork { ALL.each(&:forked!) }

    # A number as Prometheus reads it.
    def self.number(value)
      return value.to_s if value.is_a?(Integer)
      return "+Inf" if value == Float::INFINITY
      (value == value.to_i && value.abs < 1e15) ? value.to_i.to_s : value.to_s
    end
  end
end
