# frozen_string_literal: true

module Herald
  class Web
    # Channels: the ones active among the latest WINDOW messages (the store contract lists no channels),
    # any other by name; one channel's last id, what it retains (messages, bytes), its messages by id, a
    # live tail through Herald's browser client, and a publish form.
    class ChannelsPage < Page
      WINDOW = 10_000
      PER_PAGE = 50
      SHOWN = 200

      def index
        from = [store.last_global_id - WINDOW, 0].max
        seen = store.global_backlog(from, limit: WINDOW).group_by { |m| [m.channel, m.site_id] }
        top = seen.sort_by { |_, msgs| -msgs.size }.first(SHOWN)
        render("Channels", "/channels") do
          "<h1>Channels</h1>#{browse_form}<p class=\"muted\">Active among the latest #{WINDOW} messages " \
            "(global ids #{from + 1}–#{store.last_global_id}), busiest first.</p><table><tr><th>Channel</th><th>Site</th>" \
            "<th>Messages in window</th><th>Bytes in window</th><th>Last id</th></tr>" \
            "#{top.map { |(channel, site), msgs| index_row(channel, site, msgs) }.join}</table>"
        end
      end

      def show
        channel = channel!
        site = site_id
        retained = store.backlog(channel, 0, site_id: site)
        after = integer("after", default: [store.last_id(channel, site_id: site) - PER_PAGE, 0].max)
        shown = retained.select { |m| m.message_id > after }.first(PER_PAGE)
        render(channel, "/channels") do
          "<h1>Channel #{h(channel)}#{" <span class=\"muted\">site #{h(site)}</span>" if site}</h1>#{summary(channel, site, retained)}" \
            "#{browse_form(channel, site)}<table><tr><th>Id</th><th>Global id</th><th>Published</th><th>Codec</th><th>Data</th></tr>" \
            "#{shown.map { |m| message_row(m) }.join}</table>#{pager(channel, site, after, shown)}#{tail(channel, site)}#{publish_form(channel, site)}"
        end
      end

      # Publishes JSON (as typed) on a channel through the dashboard's bus.
      def publish
        channel = channel!
        data = begin
          JSON.parse(@req["data"].to_s)
        rescue JSON::ParserError => e
          raise InvalidArgumentError, "the data is not JSON: #{e.message[0, 200]}"
        end
        id = bus.publish(channel, data, site_id: site_id)
        redirect("/channel?#{URI.encode_www_form({"name" => channel, "site" => site_id}.compact)}", "Published message #{id} on #{channel}")
      end

      private

      def channel!
        channel = @req["name"].to_s
        raise InvalidArgumentError, "name a channel" if channel.empty?
        channel
      end

      def site_id = (@req["site"].to_s.empty? ? nil : @req["site"])

      def channel_url(channel, site, extra = {}) = @html.url("/channel", {"name" => channel, "site" => site}.merge(extra))

      def index_row(channel, site, msgs)
        "<tr><td><a href=\"#{channel_url(channel, site)}\">#{h(channel)}</a></td><td>#{h(site)}</td>" \
          "<td class=\"num\">#{msgs.size}</td><td class=\"num\">#{@html.bytes(msgs.sum { |m| m.payload.bytesize })}</td>" \
          "<td class=\"num\">#{msgs.last.message_id}</td></tr>"
      end

      def summary(channel, site, retained)
        bytes = retained.sum { |m| m.payload.bytesize }
        "<table><tr><th>Last id</th><th>Retained messages</th><th>Retained bytes</th><th>Published/min</th><th>Oldest retained</th>" \
          "<th>Retention</th></tr><tr><td class=\"num\">#{store.last_id(channel, site_id: site)}</td>" \
          "<td class=\"num\">#{retained.size}</td><td class=\"num\">#{@html.bytes(bytes)}</td>" \
          "<td class=\"num rate\">#{last_minute(retained)}</td>" \
          "<td>#{"##{retained.first.message_id} at #{@html.time(retained.first.created_at)}" if retained.first}</td>" \
          "<td>#{h(retention(channel, site))}</td></tr></table>"
      end

      # Retained messages published in the last 60 s (as retention allows: a channel keeping fewer shows fewer).
      def last_minute(retained)
        since = Process.clock_gettime(Process::CLOCK_REALTIME) - 60
        retained.reverse_each.take_while { |m| m.created_at >= since }.size
      end

      # The channel's retention as the store reports it (Store#retention).
      def retention(channel, site)
        size, age = store.retention(channel, site_id: site)
        "#{size} messages, #{duration(age)}"
      end

      # In the largest unit that divides it: 604800 => "7 days", 3600 => "1 h", 90 => "90 s".
      def duration(seconds)
        [[86_400, "days"], [3600, "h"], [60, "min"]].each do |unit, name|
          return "#{seconds / unit} #{name}" if seconds >= unit && (seconds % unit).zero?
        end
        "#{seconds} s"
      end

      def browse_form(channel = nil, site = nil)
        "<form class=\"bar\" method=\"get\" action=\"#{@html.url("/channel")}\"><label>Channel <input name=\"name\" " \
          "value=\"#{h(channel)}\" size=\"40\"></label><label>site <input name=\"site\" value=\"#{h(site)}\" size=\"8\"></label>" \
          "<label>after id <input name=\"after\" size=\"8\"></label><button>Browse</button></form>"
      end

      def message_row(m)
        "<tr><td class=\"num\">#{m.message_id}</td><td class=\"num\">#{m.global_id}</td><td>#{@html.time(m.created_at)}</td>" \
          "<td>#{h(m.codec.name)}</td><td>#{@html.payload(m, limit: 2000)}</td></tr>"
      end

      def pager(channel, site, after, shown)
        older = [after - PER_PAGE, 0].max
        links = []
        links << "<a href=\"#{channel_url(channel, site, "after" => older)}\">← older</a>" if after > 0
        links << "<a href=\"#{channel_url(channel, site, "after" => shown.last.message_id)}\">newer →</a>" if shown.size == PER_PAGE
        "<p class=\"bar\">#{links.join(" ")}</p>"
      end

      # Herald's own browser client (served at <mount>/herald.js) subscribes from the channel's last id;
      # rows are built with textContent, never as HTML.
      def tail(channel, site)
        return "<p class=\"muted\">Live tail: not for site channels.</p>" if site
        "<h2>Live tail</h2><table id=\"tail\" data-channel=\"#{h(channel)}\" data-last-id=\"#{store.last_id(channel)}\" " \
          "data-base=\"#{h(@web.message_bus_path)}\"><tr><th>Id</th><th>Received</th><th>Data</th></tr></table>" \
          "<p class=\"muted\" id=\"tail-status\">connecting…</p><script src=\"#{@html.url("/herald.js")}\"></script>" \
          "<script>#{TAIL_JS}</script>"
      end

      TAIL_JS = <<~JS
        (() => {
          const table = document.getElementById("tail"), status = document.getElementById("tail-status");
          const client = new Herald({ baseUrl: table.dataset.base, onError: (e) => { status.textContent = "error: " + e.message; } });
          client.subscribe(table.dataset.channel, (data, msg) => {
            const row = table.insertRow(1);
            row.insertCell().textContent = msg.message_id;
            row.insertCell().textContent = new Date().toISOString();
            const code = document.createElement("code");
            code.textContent = typeof data === "string" ? data : JSON.stringify(data);
            row.insertCell().appendChild(code);
            status.textContent = "live: last message " + msg.message_id;
          }, { lastId: Number(table.dataset.lastId) });
          status.textContent = "live";
        })();
      JS

      def publish_form(channel, site)
        return "" if @html.read_only
        "<h2>Publish</h2><form method=\"post\" action=\"#{@html.url("/channel/publish")}\">#{@html.hidden("name", channel)}" \
          "#{@html.hidden("site", site.to_s)}#{@html.csrf_field}<textarea name=\"data\" rows=\"3\" cols=\"60\" " \
          "placeholder='{\"text\": \"hello\"}'></textarea><br><button>Publish JSON</button></form>"
      end
    end
  end
end
