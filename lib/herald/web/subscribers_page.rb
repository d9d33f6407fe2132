# frozen_string_literal: true

module Herald
  class Web
    # Durable subscribers: cursor, lag, lease holder, dead letters; pause, resume, move the cursor.
    class SubscribersPage < Page
      def show
        status = SubscriberStatus.new(store)
        rows = SubscriberStatus.names(store).map { |name| status.row(name) }
        render("Subscribers", "/subscribers", refresh: refresh) do
          "<h1>Subscribers</h1><p class=\"muted\">Log's last global id: #{store.last_global_id}. Lag counts a " \
            "subscriber's own events after its cursor (every message when its class is not loaded here); events/s " \
            "from the cursor's moves between page loads. #{refresh_link}</p>" \
            "<table><tr><th>Subscriber</th><th>Cursor</th><th>Lag (events)</th><th>Lag (seconds)</th>" \
            "<th>Events/s</th><th>Lease holder</th><th>Retrying</th><th>Dead letters</th><th>State</th><th>Actions</th></tr>" \
            "#{rows.map { |r| row(r) }.join}</table>#{"<p class=\"muted\">No durable subscribers yet.</p>" if rows.empty?}"
        end
      end

      def pause
        store.pause(name!)
        redirect("/subscribers", "Paused #{name!}: its worker stops within a moment, wherever it runs")
      end

      def resume
        store.resume(name!)
        redirect("/subscribers", "Resumed #{name!}")
      end

      # Moves a paused subscriber's cursor to just before a global id, or before the first message at or
      # after a time. Only while paused and with its lease free (its worker let go): the lease is taken
      # for the move, so no worker saves over it.
      def reset
        name = name!
        raise BusyError, "pause #{name} before moving its cursor" unless store.paused?(name)
        cursor = target_cursor
        lease = store.lease(name) or
          raise BusyError, "#{name}'s worker still holds its lease (#{store.lease_holder(name)}): wait a moment and try again"
        begin
          store.mark_reset(name, store.last_id(Events::DeadLetters.channel(name)))
          store.save_cursor(name, cursor)
        ensure
          lease.release
        end
        redirect("/subscribers", "#{name}'s cursor is now #{cursor}: it reads from global id #{cursor + 1} once resumed")
      end

      private

      REFRESH = 2 # seconds, with ?refresh=on

      def refresh = (@req["refresh"] == "on") ? REFRESH : nil

      def refresh_link
        return "<a href=\"#{@html.url("/subscribers")}\">Stop refreshing</a>" if refresh
        "<a href=\"#{@html.url("/subscribers", "refresh" => "on")}\">Refresh every #{REFRESH} s</a>"
      end

      def name!
        name = @req["name"].to_s
        raise InvalidArgumentError, "name the subscriber" if name.empty?
        name
      end

      def target_cursor
        if (id = integer("id"))
          return [id - 1, 0].max
        end
        at = @req["time"].to_s.strip
        raise InvalidArgumentError, "give a global id or a time" if at.empty?
        time = begin
          Time.parse(at).to_f
        rescue ArgumentError
          raise InvalidArgumentError, "not a time: #{at[0, 60].inspect} (e.g. 2026-11-28 04:00:00 UTC)"
        end
        first_at_or_after(time)
      end

      # The cursor just before the first retained message published at or after `time` (the log's last id
      # when none is).
      def first_at_or_after(time)
        after = 0
        loop do
          batch = store.global_backlog(after, limit: 1000)
          return store.last_global_id if batch.empty?
          found = batch.find { |m| m.created_at >= time }
          return found.global_id - 1 if found
          after = batch.last.global_id
        end
      end

      def row(r)
        name = r.name
        state = r.paused ? "<span class=\"paused\">paused</span>" : "running"
        lag = r.lag.nil? ? "" : "#{r.lag}#{"+" if r.lag_more}"
        seconds = r.lag_seconds ? format("%.1f", r.lag_seconds) : ""
        "<tr data-subscriber=\"#{h(name)}\"><td>#{h(name)}#{" <span class=\"muted\">(not loaded here)</span>" unless r.subscriber}" \
          "#{"<div class=\"error\">#{h(r.error)}</div>" if r.error}</td><td class=\"num\">#{h(r.cursor)}</td>" \
          "<td class=\"num lag\">#{lag}</td><td class=\"num\">#{seconds}</td><td class=\"num rate\">#{r.rate&.round(1)}</td><td>#{h(r.holder || "none")}</td><td>#{retrying(r)}</td>" \
          "<td class=\"num\"><a href=\"#{@html.url("/dead", "subscriber" => name)}\">#{r.dead}</a></td><td>#{state}</td>" \
          "<td>#{actions(r)}</td></tr>"
      end

      def retrying(r)
        return "" unless r.retrying
        global_id, attempt = r.retrying
        "global id #{global_id}, attempt #{attempt} of #{r.subscriber&.retry_policy&.attempts || "?"}"
      end

      def actions(r)
        return "" if @html.read_only
        return @html.button("/subscribers/pause", "Pause", {"name" => r.name}) unless r.paused
        @html.button("/subscribers/resume", "Resume", {"name" => r.name}) + reset_form(r.name)
      end

      def reset_form(name)
        "<details><summary>Move cursor</summary><form method=\"post\" action=\"#{@html.url("/subscribers/reset")}\" " \
          "onsubmit=\"return confirm('Move the cursor? Events after it run again; events before it are skipped.')\">" \
          "#{@html.hidden("name", name)}#{@html.csrf_field}<label>read again from global id <input name=\"id\" size=\"8\"></label> " \
          "<label>or time <input name=\"time\" placeholder=\"2026-11-28 04:00 UTC\"></label> <button>Move</button></form></details>"
      end
    end
  end
end
