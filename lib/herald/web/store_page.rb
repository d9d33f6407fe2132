# frozen_string_literal: true

module Herald
  class Web
    # The store: its kind, epoch, last id and what it reports of itself (Store#stats: the log's segments
    # and bytes, fsync policy, free disk, write-lease holder; a networked store's server), and what this
    # process counts (Herald::Metrics: parked HTTP clients, messages published; other processes: /metrics).
    class StorePage < Page
      def show
        facts = {"epoch" => store.epoch, "last global id" => store.last_global_id,
                 "reads from this process's memory" => store.local_reads?}.merge(store.stats)
        facts["parked HTTP clients (this process #{Store.lease_holder_id})"] = Herald::Metrics::PARKED.count
        facts["published by this process"] = Herald::Metrics::PUBLISHED.value
        render("Store", "/store") do
          "<h1>Store</h1><table>#{facts.map { |k, v| "<tr><th>#{h(k.to_s.tr("_", " "))}</th><td>#{value(k, v)}</td></tr>" }.join}</table>"
        end
      end

      private

      def value(key, v)
        return h(@html.bytes(v)) if key.to_s.end_with?("bytes") && v.is_a?(Integer) && !key.to_s.start_with?("max")
        h(v.nil? ? "unknown" : v)
      end
    end
  end
end
