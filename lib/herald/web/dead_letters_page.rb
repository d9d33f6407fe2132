# frozen_string_literal: true

module Herald
  class Web
    # Dead letters of every subscriber (or one), filtered by subscriber and error class, newest first,
    # PER_PAGE a page; Retry / Delete one, or all that the filter shows.
    #
    # Retry runs the subscriber's handler in this process (as `herald replay` does) when its class is
    # loaded here, else asks its worker through the store (DeadLetters#request_retry), which runs it within
    # a moment. Events::DeadLetters#retry_letters takes a lease, so two retries never overlap, and marks
    # each letter resolved right after its call: a retried event is handled once.
    class DeadLettersPage < Page
      PER_PAGE = 50

      # Works on the stored messages: only the letters shown are rebuilt (Letter); the error filter reads
      # each message's decoded data, which the in-memory stores keep with the message.
      def show
        letters = filtered
        page = [integer("page", default: 1), 1].max
        pages = [(letters.size + PER_PAGE - 1) / PER_PAGE, 1].max
        shown = (letters.reverse.slice((page - 1) * PER_PAGE, PER_PAGE) || []).map { |_, m| dead_letters.letter(m) }
        render("Dead letters", "/dead") do
          "<h1>Dead letters</h1>#{filters(letters.size)}#{bulk_actions(letters.size)}" \
            "<table><tr><th>Subscriber</th><th>#</th><th>Event</th><th>Error</th><th>Attempts</th>" \
            "<th>Failed at</th><th>Payload</th><th></th></tr>#{shown.map { |l| row(l) }.join}</table>" \
            "#{pager(page, pages)}"
        end
      end

      # Here when the subscriber's class is loaded in this process; else its worker is asked, through the store.
      def retry
        local, remote = by_subscriber(targets).partition { |name, _| SubscriberStatus.new(store).subscriber(name) }
        results = local.flat_map { |name, ids| dead_letters.retry_letters(SubscriberStatus.new(store).subscriber(name), ids) }
        remote.each { |name, ids| dead_letters.request_retry(name, ids) }
        failed = results.count { |_, e| e }
        notice = []
        notice << "Retried #{results.size} dead letters: #{results.size - failed} handled, #{failed} failed again" unless local.empty?
        remote.each { |name, ids| notice << "Asked #{name}'s worker to retry #{ids.size} dead letters (it runs elsewhere)" }
        redirect(back, notice.join("; "))
      end

      def delete
        groups = by_subscriber(targets)
        groups.each { |name, ids| dead_letters.resolve(name, ids, "deleted") }
        redirect(back, "Deleted #{groups.sum { |_, ids| ids.size }} dead letters")
      end

      private

      def dead_letters = @dead_letters ||= Events::DeadLetters.new(store)

      def subscriber_filter = @req["subscriber"].to_s

      def error_filter = @req["error"].to_s

      def all_names = @all_names ||= SubscriberStatus.names(store)

      def names
        @names ||= subscriber_filter.empty? ? all_names : [subscriber_filter]
      end

      # [[subscriber name, stored dead-letter message], ...] not resolved yet, oldest first per subscriber.
      def pending
        @pending ||= names.flat_map do |name|
          resolved = dead_letters.resolved_ids(name)
          store.backlog(Events::DeadLetters.channel(name), 0).filter_map { |m| [name, m] unless resolved.include?(m.message_id) }
        end
      end

      def filtered
        error_filter.empty? ? pending : pending.select { |_, m| m.data["error"] == error_filter }
      end

      # The letters a POST names: "ids" as "subscriber:id" pairs, or every one the filter shows.
      def targets
        return filtered.map { |name, m| [name, m.message_id] } if @req["scope"] == "filtered"
        @req.all("ids").map do |pair|
          name, id = pair.rpartition(":").values_at(0, 2)
          raise InvalidArgumentError, "not a dead letter: #{pair[0, 80].inspect}" unless id.match?(/\A\d{1,19}\z/) && !name.empty?
          [name, Integer(id, 10)]
        end
      end

      def by_subscriber(pairs) = pairs.group_by(&:first).transform_values { |v| v.map(&:last) }

      def back = "/dead?#{URI.encode_www_form("subscriber" => subscriber_filter, "error" => error_filter)}"

      def filters(count)
        errors = pending.map { |_, m| m.data["error"].to_s }.uniq.sort
        "<form class=\"bar\" method=\"get\" action=\"#{@html.url("/dead")}\">Subscriber #{select("subscriber", all_names, subscriber_filter)}" \
          " Error #{select("error", errors, error_filter)} <button>Filter</button> <span class=\"muted\">#{count} dead letters</span></form>"
      end

      def select(name, options, chosen)
        opts = [["", "any"], *options.map { |o| [o, o] }].map do |value, label|
          "<option value=\"#{h(value)}\"#{" selected" if value == chosen}>#{h(label)}</option>"
        end
        "<select name=\"#{h(name)}\">#{opts.join}</select>"
      end

      def bulk_actions(count)
        return "" if count.zero? || @html.read_only
        fields = {"scope" => "filtered", "subscriber" => subscriber_filter, "error" => error_filter}
        "<div class=\"bar\">#{@html.button("/dead/retry", "Retry all #{count}", fields, confirm: "Retry all #{count} dead letters shown?")}" \
          "#{@html.button("/dead/delete", "Delete all #{count}", fields, confirm: "Delete all #{count} dead letters shown?")}</div>"
      end

      def row(l)
        fields = {"ids" => "#{l.subscriber}:#{l.id}", "subscriber" => subscriber_filter, "error" => error_filter}
        trace = Array(l.backtrace)
        "<tr data-letter=\"#{h(l.id)}\"><td>#{h(l.subscriber)}</td><td class=\"num\">#{l.id}</td>" \
          "<td>#{h(l.channel)} <span class=\"muted\">##{l.global_id}</span></td>" \
          "<td><strong>#{h(l.error)}</strong> #{h(l.error_message.to_s[0, 500])}" \
          "#{"<details><summary>backtrace</summary><pre>#{h(trace.join("\n"))}</pre></details>" unless trace.empty?}</td>" \
          "<td class=\"num\">#{l.attempts}</td><td>#{@html.time(l.failed_at)}</td><td>#{@html.payload(l.message)}</td>" \
          "<td>#{@html.button("/dead/retry", "Retry", fields)} #{@html.button("/dead/delete", "Delete", fields, confirm: "Delete this dead letter?")}</td></tr>"
      end

      def pager(page, pages)
        return "" if pages <= 1
        link = ->(n, label) { "<a href=\"#{@html.url("/dead", "subscriber" => subscriber_filter, "error" => error_filter, "page" => n)}\">#{label}</a>" }
        "<p class=\"bar\">#{link.call(page - 1, "← newer") if page > 1} page #{page} of #{pages} #{link.call(page + 1, "older →") if page < pages}</p>"
      end
    end
  end
end
