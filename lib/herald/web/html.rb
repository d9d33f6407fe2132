# frozen_string_literal: true

require "erb"

module Herald
  class Web
    # HTML building: every value that came from users or the store goes through `h` (channel names,
    # payloads, error messages are arbitrary UTF-8), so pages are built from escaped strings only.
    class Html
      HEADERS = {"content-type" => "text/html; charset=utf-8", "cache-control" => "no-store",
                 "x-frame-options" => "DENY", "x-content-type-options" => "nosniff"}.freeze
      NAV = [["/subscribers", "Subscribers"], ["/dead", "Dead letters"], ["/channels", "Channels"], ["/store", "Store"]].freeze
      CSS = <<~CSS
        body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
        header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
        header a{color:#cfd8ea;text-decoration:none}header a.on{color:#fff;font-weight:600}
        header .ro{margin-left:auto;background:#8a5a00;padding:2px 8px;border-radius:4px}
        main{padding:16px;max-width:1400px}h1{font-size:20px;margin:0 0 12px}
        table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:12px}
        th,td{border-bottom:1px solid #e3e6ec;padding:4px 8px;text-align:left;vertical-align:top}
        th{background:#eef1f6;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
        code,pre{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;margin:0}
        form.inline{display:inline}button{cursor:pointer}.notice{background:#e4f4e4;padding:6px 10px}
        .error{background:#fbe3e3;padding:6px 10px}.muted{color:#6b7385}.paused{color:#a0522d;font-weight:600}
        .bar{display:flex;gap:8px;align-items:center;margin:8px 0;flex-wrap:wrap}
        details summary{cursor:pointer}
      CSS

      def self.h(value) = ERB::Util.html_escape(value.to_s.dup.force_encoding(Encoding::UTF_8).scrub)

      def initialize(req, csrf, read_only:)
        @req = req
        @csrf = csrf
        @read_only = read_only
      end

      attr_reader :read_only

      def h(value) = self.class.h(value)

      # A link or form action inside the dashboard, with query parameters escaped.
      def url(path, params = {})
        params = params.reject { |_, v| v.nil? || v == "" }
        query = params.empty? ? "" : "?#{URI.encode_www_form(params)}"
        h("#{@req.script_name}#{path}#{query}")
      end

      def base = @req.script_name

      def layout(title, active, refresh: nil)
        notice = @req["notice"]
        <<~HTML
          <!doctype html><html lang="en"><head><meta charset="utf-8"><title>#{h(title)} · Herald</title>
          <meta name="viewport" content="width=device-width"><link rel="icon" href="data:,">#{"<meta http-equiv=\"refresh\" content=\"#{refresh.to_i}\">" if refresh}<style>#{CSS}</style></head><body>
          <header><strong>Herald</strong>#{nav(active)}#{'<span class="ro">read-only</span>' if @read_only}</header>
          <main>#{"<p class=\"notice\">#{h(notice)}</p>" if notice}#{yield}</main></body></html>
        HTML
      end

      # A POST button (hidden fields escaped, the CSRF token added); none in read-only mode.
      def button(path, label, fields = {}, confirm: nil)
        return "" if @read_only
        inputs = fields.flat_map { |k, v| Array(v).map { |one| hidden(k, one) } }.join
        onsubmit = confirm ? " onsubmit=\"return confirm(#{h(confirm.to_json)})\"" : ""
        "<form class=\"inline\" method=\"post\" action=\"#{url(path)}\"#{onsubmit}>#{inputs}#{csrf_field}" \
          "<button type=\"submit\">#{h(label)}</button></form>"
      end

      def csrf_field = hidden(Csrf::FIELD, @csrf.token)

      def hidden(name, value) = "<input type=\"hidden\" name=\"#{h(name)}\" value=\"#{h(value)}\">"

      def time(seconds)
        return "" unless seconds
        Time.at(seconds).utc.strftime("%Y-%m-%d %H:%M:%S UTC")
      end

      def bytes(n)
        return "" unless n
        units = %w[B KiB MiB GiB TiB]
        i = 0
        value = n.to_f
        while value >= 1024 && i < units.size - 1
          value /= 1024
          i += 1
        end
        (i == 0) ? "#{n} B" : format("%.1f %s", value, units[i])
      end

      # A message's data for people: JSON text as stored, other codecs decoded and shown as JSON; what
      # cannot be decoded here (an event class this process lacks) as its bytes. Cut at `limit` characters.
      def payload(msg, limit: 300)
        text = if msg.codec.equal?(Codec::Json)
          msg.payload.dup.force_encoding(Encoding::UTF_8).scrub
        else
          begin
            JSON.generate(msg.data)
          rescue => e
            "(#{e.class}: #{msg.payload.bytesize} bytes #{msg.payload.b[0, 64].inspect})"
          end
        end
        text = "#{text[0, limit]}…" if limit && text.length > limit
        "<code>#{h(text)}</code>"
      end

      private

      def nav(active)
        NAV.map { |path, label| "<a href=\"#{url(path)}\"#{' class="on"' if path == active}>#{label}</a>" }.join
      end
    end

    # What every page shares: the app, the request, HTML helpers.
    class Page
      def initialize(web, req, csrf)
        @web = web
        @req = req
        @html = Html.new(req, csrf, read_only: web.read_only?)
      end

      private

      def bus = @web.bus

      def store = bus.store

      def h(value) = Html.h(value)

      def render(title, active, status: 200, refresh: nil, &block)
        [status, Html::HEADERS.dup, [@html.layout(title, active, refresh: refresh, &block)]]
      end

      def redirect(path, notice) = @web.redirect(@req, path, notice: notice)

      def integer(key, default: nil)
        value = @req[key].to_s.strip
        return default if value.empty?
        raise InvalidArgumentError, "#{key} must be a whole number, got #{value[0, 40].inspect}" unless value.match?(/\A\d{1,19}\z/)
        Integer(value, 10)
      end
    end
  end
end
