# frozen_string_literal: true

module Herald
  class Web
    # A Rack app answering every GET with this process's Herald metrics in Prometheus' text format
    # (version 0.0.4), every name prefixed `herald_`:
    #
    #   run Herald::Web::Metrics.new                      # the default bus (Herald.configure)
    #   Herald::Web::Metrics.new(bus: bus, subscribers: ["Mailer"])
    #
    # Counters and histograms are this process's (Herald::Metrics): scrape every process (each Puma worker,
    # each `herald server` worker) or sum them. Gauges read from the store at scrape time (subscriber lag,
    # log bytes) are the same from every process. No label is a channel (their number is unbounded); the
    # subscriber label takes the app's subscriber class names, capped at Herald::Metrics::MAX_LABEL_VALUES.
    class Metrics
      CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

      # bus: whose store to read (default: Herald.bus, looked up at each scrape); subscribers: the deferred
      # subscribers' names to report lag for (default: every deferred subscriber class this process loaded).
      def initialize(bus: nil, subscribers: nil)
        @bus = bus
        @subscribers = subscribers&.map(&:to_s)&.freeze
      end

      def call(env)
        return [405, {"content-type" => "text/plain", "allow" => "GET, HEAD"}, ["GET only\n"]] unless %w[GET HEAD].include?(env["REQUEST_METHOD"])
        body = render
        [200, {"content-type" => CONTENT_TYPE, "cache-control" => "no-store"}, [(env["REQUEST_METHOD"] == "HEAD") ? "" : body]]
      end

      # The whole exposition, as a String.
      def render
        out = +""
        Herald::Metrics::ALL.each { |metric| family(out, metric.name, metric.type, metric.help, metric.samples) }
        gauges.each { |name, help, samples| family(out, name, "gauge", help, samples) }
        out
      end

      private

      def bus = @bus || Herald.bus

      # [name, help, [[sample name, labels, value]]]: what the store and this process's reactors hold now.
      # A store that cannot be read is reported by herald_store_up 0, never by a failed scrape.
      def gauges
        store = bus.store
        list = [["herald_parked_clients", "HTTP clients parked in this process (long polls and streams)",
          [["herald_parked_clients", nil, Herald::Metrics::PARKED.count]]]]
        begin
          lags = Events::Lag.all(store, @subscribers || Events::Lag.names)
          bytes = store.bytes_on_disk
          last = store.last_global_id
        rescue Herald::Error => e
          Herald.logger.warn "metrics: the store could not be read: #{e.class}: #{e.message}"
          return list << store_up(0)
        end
        list << store_up(1)
        list << ["herald_last_global_id", "The store's last global id", [["herald_last_global_id", nil, last]]]
        list << ["herald_log_bytes", "Bytes the log's segment files take on disk", [["herald_log_bytes", nil, bytes]]] if bytes
        list << lag_family("herald_subscriber_lag_messages", "Messages after a deferred subscriber's saved cursor", lags, :messages)
        list << lag_family("herald_subscriber_lag_seconds", "How long the oldest message after a deferred subscriber's cursor has waited", lags, :seconds)
      end

      def store_up(value) = ["herald_store_up", "1 when the store answered this scrape", [["herald_store_up", nil, value]]]

      def lag_family(name, help, lags, field)
        [name, help, lags.map { |lag| [name, {"subscriber" => lag.subscriber}, lag[field]] }]
      end

      def family(out, name, type, help, samples)
        out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        samples.each do |sample, labels, value|
          out << sample
          out << "{" << labels.map { |k, v| "#{k}=\"#{escape(v)}\"" }.join(",") << "}" if labels && !labels.empty?
          out << " " << Herald::Metrics.number(value) << "\n"
        end
      end

      # Label values as the text format wants them: backslash, double quote and newline escaped.
      def escape(value) = value.to_s.gsub(/[\\"\n]/) { |c| (c == "\n") ? "\\n" : "\\#{c}" }
    end
  end
end
