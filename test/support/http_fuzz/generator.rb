# frozen_string_literal: true

require "json"
require "msgpack"
require_relative "framing"

module Herald
  module HttpFuzz
    # One request to send: its raw bytes, how to send them, and what may legitimately come back.
    #   well_formed  the HTTP framing is valid (a reply is owed, unless the request may park)
    #   parks        a poll or stream the server may hold open (no dlp=t): silence is no hang
    #   delivery     :send (all at once), :slow (in pieces), :truncated (a prefix, then EOF),
    #                :abandon (sent, then closed without reading), :pipelined (two requests)
    #   release      a parked non-chunked poll on /chat that a publish must answer
    Case = Struct.new(:index, :kind, :bytes, :well_formed, :parks, :delivery, :cut, :release, keyword_init: true)

    # Random HTTP requests for `herald server`, well-formed and malformed. Case i is generated from its own
    # Random (seed and i), so one case replays alone with the same seed and its index.
    class Generator
      UNICODE = ["é", "ñ", "日本語", "中文", "🎉", "👨‍👩‍👧", "\u200d", "\u0000", "ü", "Ω", "\u{10FFFF}", "\u202e", "ﬀ"].freeze
      CHANNELS = [
        "/chat", "/a", "/ünïcödé", "/日本語/チャンネル", "/emoji/🎉👨‍👩‍👧", "/pipe|x", "/$$", "/a$|$b", "abc", "", "/",
        "/nul\0x", "/sp ace", "/%41", "/+plus", "/amp&x", "/eq=x", "/new\nline", "/tab\t", "/__status", "__seq",
        "/global/x", "/quote\"'<>", "/back\\slash", "/semi;colon", "/..", "//", "/#{"x" * 300}", "/#{"é" * 120}"
      ].freeze
      RAW_BAD = ["\xFF", "\xC3\x28", "\xE2\x82", "\xF0\x9F\x98", "\xC0\xAF", "\xED\xA0\x80", "\x80"].map(&:b).freeze
      IDS = [-1, -1, -2, -3, 0, 0, 1, 5, 2**62, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**30, "", nil, "abc",
        "1.5", 1.5, true, false, [1], {"a" => 1}, "0x10", " 1", "-0", "1e3", "٣", "00000000000000000001", "-"].freeze
      CONTENT_TYPES = [
        "application/x-www-form-urlencoded", "application/x-www-form-urlencoded; charset=UTF-8", "application/json",
        "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain", "multipart/form-data; boundary=x",
        "application/vnd.msgpack", "", nil, "application/x-www-form-urlencoded; charset=\xFF".b, "text/xml",
        "application/jsonp", "*/*"
      ].freeze
      METHODS = %w[POST POST POST POST GET GET PUT DELETE OPTIONS OPTIONS PATCH HEAD TRACE].freeze
      BAD_METHODS = ["FOO", "post", "", "GET\xFF".b, "P OST", "CONNECT", "PROPFIND", "G" * 300].freeze
      VERSIONS = ["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0"].freeze
      BAD_VERSIONS = ["HTTP/2.0", "HTTP/9.9", "HTXP/1.1", "", "HTTP/1.1\xFF".b, "http/1.1"].freeze
      KINDS = {poll: 40, sse: 10, demo: 12, asset: 4, options: 4, garbage_line: 5, bad_headers: 6,
               chunked_body: 6, huge: 3, release: 4, supersede: 3, pipelined: 3, other_path: 3, framing: 4}.freeze

      # kinds: only these (e.g. [:huge, :poll]) to aim a soak; all of KINDS by default.
      def initialize(seed, kinds: nil)
        @seed = seed
        @kinds = KINDS.slice(*(kinds || KINDS.keys)).flat_map { |kind, weight| [kind] * weight }
        raise ArgumentError, "no such kinds: #{kinds.inspect}, expected some of #{KINDS.keys}" if @kinds.empty?
      end

      def case_at(index)
        @r = Random.new(@seed * 2**32 + index) # seeds next to each other share no case
        kind = pick(@kinds)
        c = send(kind)
        c.index = index
        c.kind = kind
        c.delivery ||= pick_delivery(c)
        c.cut = @r.rand(1...[c.bytes.bytesize, 2].max) if c.delivery == :truncated && c.kind != :supersede
        c
      end

      private

      def pick(list) = list[@r.rand(list.size)]

      def hex(bytes) = @r.bytes(bytes).unpack1("H*")

      def chance(p) = @r.rand < p

      def pick_delivery(c)
        x = @r.rand
        if x < 0.04 then :truncated
        elsif x < 0.06 then :slow
        elsif x < 0.12 then :abandon
        else
          c.parks ? :abandon_later : :send
        end
      end

      # --- case kinds -----------------------------------------------------------------------------

      def poll
        query = pick(["?dlp=t", "?dlp=t", "", "?dlp=t&x=%FF", "?dlp=t&\xFF=1".b, "?#{garbage(20)}", "?dlp=tt"])
        body, type = poll_body
        method = chance(0.9) ? "POST" : pick(METHODS)
        headers = poll_headers
        parks = !query.include?("dlp=t") && method != "OPTIONS"
        build(method, "/message-bus/#{client_id}/#{pick(["poll", "poll", "", "anything"])}#{query}", body: body, type: type,
          headers: headers, parks: parks)
      end

      def sse
        query = sse_query
        headers = poll_headers
        headers["Last-Event-ID"] = pick(["0", "5", "-5", "abc", "", "99999999999999999999", "1\xFF".b, "9223372036854775807"]) if chance(0.3)
        build("GET", "/message-bus/#{client_id}/sse?#{query}", headers: headers, parks: true)
      end

      # POST /chat: the demo page's form and JSON bodies (publishes to /chat).
      def demo
        fields = {}
        fields["text"] = demo_value if chance(0.9)
        fields["name"] = demo_value if chance(0.6)
        fields[pick(["extra", "é", ""])] = demo_value if chance(0.1)
        body, type = case @r.rand(4)
        when 0 then [json(fields), "application/json"]
        when 1 then [form(fields.transform_values(&:to_s)), "application/x-www-form-urlencoded"]
        when 2 then [raw_form(fields.transform_values(&:to_s)), pick(["application/x-www-form-urlencoded", nil])]
        else [pick([garbage(@r.rand(200)), "[1,2]", "{", "null", "\"text\"", "{\"text\": {\"a\": 1}}"]), pick(CONTENT_TYPES)]
        end
        build("POST", pick(["/chat", "/chat", "/chat?x=1", "/chat/"]), body: body, type: type)
      end

      def asset
        path = pick(["/", "/message-bus/herald.js", "/message-bus/herald.js/x", "/assets/demo.js", "/assets/demo.css",
          "/assets/message-bus.js", "/assets/message-bus-ajax.js", "/assets/../../../etc/passwd",
          "/assets/%2e%2e/%2e%2e/lib/herald.rb", "/index.html", "/assets/", "/favicon.ico"])
        method = pick(%w[GET GET HEAD POST DELETE])
        script = path == "/message-bus/herald.js" && %w[GET HEAD].include?(method)
        headers = (script && chance(0.3)) ? {"If-None-Match" => pick(["\"x\"", "*", "\xFF".b])} : {}
        # Anything else under /message-bus/ is a poll (any method, as in message_bus): it may park.
        build(method, path, headers: headers, parks: path.start_with?("/message-bus/") && !script)
      end

      def options
        build("OPTIONS", "/message-bus/#{client_id}/poll", headers: {"Origin" => "http://example.com",
                                                                     "Access-Control-Request-Method" => "POST"})
      end

      # A request line that is not HTTP: bad methods, versions, targets and raw bytes.
      def garbage_line
        case @r.rand(5)
        when 0 then Case.new(bytes: garbage(@r.rand(1..400)) + "\r\n\r\n", well_formed: false)
        when 1 then raw_request(pick(BAD_METHODS), "/message-bus/#{client_id}/poll?dlp=t", pick(VERSIONS))
        when 2 then raw_request("POST", "/message-bus/#{client_id}/poll?dlp=t", pick(BAD_VERSIONS))
        when 3 then raw_request("GET", pick(["/\xFF".b, "*", "http://h/message-bus/x/poll?dlp=t", "/#{"a" * 20_000}",
          "/message-bus/\xFF/poll?dlp=t".b, "/ space", "", "/message-bus/x/poll?dlp=t#frag", "/%00"]), "HTTP/1.1")
        else Case.new(bytes: pick(["\r\n\r\n", "\r\n", "GET\r\n\r\n", "GET / HTTP/1.1\n\n", "\0" * 50, "GET / HTTP/1.1\r\nHost: x"]),
          well_formed: false)
        end
      end

      # Header syntax that Puma or the middleware must refuse (or tolerate) without a 5xx.
      def bad_headers
        body, type = poll_body
        base = "POST /message-bus/#{client_id}/poll?dlp=t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        base += "Content-Type: #{type}\r\n" if type
        extra = case @r.rand(9)
        when 0 then "Content-Length: #{body.bytesize}\r\nContent-Length: #{body.bytesize + 3}\r\n"
        when 1 then "Content-Length: #{pick(["-1", "abc", "99999999999999999999999", "", " 5", "0x10"])}\r\n"
        when 2 then "Content-Length: #{body.bytesize}\r\nTransfer-Encoding: #{pick(["chunked", "gzip", "chunked, gzip", "identity", "\xFF".b])}\r\n"
        when 3 then "Content-Length: #{body.bytesize}\r\nX-#{garbage(5).delete("\r\n:")}: #{garbage(20).delete("\r\n")}\r\n"
        when 4 then "Content-Length: #{body.bytesize}\r\nX-Big: #{"a" * pick([8_000, 90_000, 200_000])}\r\n"
        when 5 then "Content-Length: #{body.bytesize}\r\n" + (1..pick([100, 1000, 3000])).map { |i| "X-H#{i}: v\r\n" }.join
        when 6 then "Content-Length: #{body.bytesize}\r\nBad Header\r\n"
        when 7 then "Content-Length: #{body.bytesize}\r\n folded: continuation\r\n"
        else "Content-Length: #{body.bytesize}\r\nExpect: 100-continue\r\n"
        end
        Case.new(bytes: (base.b + extra.b + "\r\n" + body.b), well_formed: false)
      end

      # A poll whose body is sent with chunked transfer-encoding, framed right or wrong.
      def chunked_body
        body, type = poll_body
        framed = if chance(0.6)
          pieces = body.bytes.each_slice(@r.rand(1..64)).map { |s| s.pack("C*") }
          pieces.map { |p| "#{p.bytesize.to_s(16)}\r\n#{p}\r\n" }.join + "0\r\n\r\n"
        else
          pick(["zz\r\nabc\r\n0\r\n\r\n", "5\r\nab\r\n0\r\n\r\n", "#{"f" * 20}\r\nx\r\n", "3\r\nabc", "1;ext=\xFF\r\na\r\n0\r\n\r\n".b,
            "-1\r\nx\r\n0\r\n\r\n", "0\r\nTrailer: x\r\n\r\n"])
        end
        head = "POST /message-bus/#{client_id}/poll?dlp=t HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
        head += "Content-Type: #{type}\r\n" if type
        Case.new(bytes: head.b + "\r\n" + framed.b, well_formed: false)
      end

      # An RFC 9112 framing case (Framing::CASES), served or refused, under any delivery.
      def framing = Case.new(bytes: pick(Framing::CASES).bytes, well_formed: false)

      def huge
        size = pick([64 * 1024, 64 * 1024 + 1, 200_000, 1024 * 1024])
        body = case @r.rand(3)
        when 0 then ("%2Fa=0&" * (size / 7 + 1)).byteslice(0, size)
        when 1 then JSON.generate("/a" => "x" * size)
        else Random.new(@r.rand(2**32)).bytes(size)
        end
        build("POST", pick(["/message-bus/#{client_id}/poll?dlp=t", "/chat"]), body: body,
          type: pick(["application/json", "application/x-www-form-urlencoded", nil]))
      end

      # A non-chunked long poll on /chat from "now": the runner publishes, and the poll must answer.
      def release
        build("POST", "/message-bus/#{hex(4)}r#{@r.rand(10**9)}/poll", body: JSON.generate("/chat" => nil),
          type: "application/json", headers: {"Dont-Chunk" => "true"}, parks: true).tap do |c|
          c.release = true
          c.delivery = :send
        end
      end

      # Two long polls with one client id (the runner sends them): the one superseded (docs/protocol.md 1.6) must
      # be answered, not leaked. `cut` carries the two __seq values (first, second).
      def supersede
        Case.new(bytes: "supersede #{hex(16)}".b, well_formed: true, parks: true, delivery: :send,
          cut: [@r.rand(0..3), @r.rand(0..3)])
      end

      def pipelined
        first = build("POST", "/message-bus/#{client_id}/poll?dlp=t", body: JSON.generate("/a" => -1), type: "application/json",
          keep_alive: true)
        second = chance(0.5) ? poll : demo
        Case.new(bytes: first.bytes + second.bytes, well_formed: second.well_formed, parks: second.parks, delivery: :pipelined)
      end

      def other_path
        path = pick(["/message-bus/", "/message-bus", "//message-bus/#{client_id}/poll?dlp=t", "/message-bus//poll?dlp=t",
          "/message-bus/#{client_id}/../x", "/MESSAGE-BUS/x/poll", "/message-bus/%2F/poll?dlp=t", "/message-bus/#{"é" * 10}/poll?dlp=t",
          "/message-bus/#{"x" * 200}/poll?dlp=t", "/message-bus/a%20b/poll?dlp=t", "/message-bus/🎉/sse?%2Fa=0"])
        method = pick(%w[POST GET OPTIONS])
        # /message-bus/ID/anything is the poll endpoint too: without dlp=t it may park.
        build(method, path, body: "%2Fa=0", type: "application/x-www-form-urlencoded",
          parks: path.start_with?("/message-bus/") && !path.include?("dlp=t") && method != "OPTIONS")
      end

      # --- pieces ---------------------------------------------------------------------------------

      def client_id = (chance(0.95) ? hex(16) : pick(["a b", "é", "x" * 129, ".", "~", "a/b", "%FF"])).b

      def poll_headers
        h = {}
        h["Dont-Chunk"] = pick(["true", "", "false"]) if chance(0.4)
        h["Accept"] = pick(["application/vnd.msgpack", "text/event-stream", "application/json", "*/*", "\xFF".b]) if chance(0.3)
        h["X-Silence-Logger"] = "true" if chance(0.3)
        h["Cookie"] = "s=#{"c" * @r.rand(5000)}" if chance(0.05)
        h["Origin"] = "http://#{pick(["example.com", "é.com", "\xFF".b])}" if chance(0.1)
        h
      end

      def poll_body
        pairs = channel_pairs
        pairs["__seq"] = pick([0, 1, 7, -1, "x", 2**70, nil]) if chance(0.3)
        case @r.rand(10)
        when 0..3 then [form(pairs), pick(["application/x-www-form-urlencoded", "application/x-www-form-urlencoded", nil])]
        when 4 then [raw_form(pairs), pick(["application/x-www-form-urlencoded", nil])]
        when 5..7 then [json_body(pairs), pick(["application/json", "application/json; charset=utf-8"])]
        when 8 then [msgpack(pairs), pick(CONTENT_TYPES)]
        else [pick(["", garbage(@r.rand(300)), "{}", "[]", "=", "&&&", "%", "%2", "a=1&=2", "[" * 600]), pick(CONTENT_TYPES)]
        end
      end

      def channel_pairs
        n = pick([0, 1, 1, 1, 2, 3, 5, 101])
        (1..n).to_h { [channel, pick(IDS)] }
      end

      def channel
        c = pick(CHANNELS).b
        c += pick(UNICODE).b if chance(0.2)
        c += pick(RAW_BAD) if chance(0.1)
        c
      end

      def sse_query
        pairs = channel_pairs
        return pick(["", "\xFF".b, "%", "/ch\xFFat=1".b, garbage(30), "%2Fa=0&" * 3000]) if chance(0.2)
        chance(0.5) ? form(pairs) : raw_form(pairs)
      end

      def demo_value
        case @r.rand(8)
        when 0 then "héllo 🎉"
        when 1 then Array.new(@r.rand(1..20)) { pick(UNICODE) }.join
        when 2 then "x" * pick([0, 1, 2000, 2001, 10_000])
        when 3 then pick([1, 2.5, true, nil, [1, "a"], {"a" => 1}])
        when 4 then "a\0b"
        when 5 then "  "
        when 6 then "text\xFF".b
        else "plain text #{@r.rand(1000)}"
        end
      end

      # Percent-encoded form: every byte escaped, or only the unsafe ones, with '+' for spaces at random.
      def form(pairs)
        pairs.map { |k, v| "#{escape(k.to_s)}=#{escape(v.nil? ? "" : v.to_s)}" }.join("&")
      end

      # Raw bytes in the form, unescaped (curl --data 'text=héllo'), sometimes invalid UTF-8.
      def raw_form(pairs) = pairs.map { |k, v| "#{k.to_s.b}=#{v.to_s.b}" }.join("&").b

      def escape(text)
        text.b.each_byte.map do |byte|
          ch = byte.chr
          if ch.match?(/[A-Za-z0-9_.~-]/) && !chance(0.05) then ch
          elsif ch == " " && chance(0.5) then "+"
          else format(chance(0.5) ? "%%%02X" : "%%%02x", byte)
          end
        end.join
      end

      def json_body(pairs)
        body = json(pairs)
        chance(0.1) ? body.byteslice(0, @r.rand(body.bytesize + 1)) : body
      end

      # JSON of any Hash, by hand: strings keep their raw bytes, so invalid UTF-8 goes out as is.
      def json(value)
        case value
        when Hash then "{" + value.map { |k, v| "#{json(k.to_s)}:#{json(v)}" }.join(",") + "}"
        when Array then "[" + value.map { |v| json(v) }.join(",") + "]"
        when String
          utf8 = value.dup.force_encoding("UTF-8")
          utf8.valid_encoding? ? JSON.generate(utf8).b : "\"#{value.b.gsub(/["\\]/n) { "\\#{_1}" }.gsub(/[\x00-\x1f]/n) { format("\\u%04x", _1.ord) }}\"".b
        else JSON.generate(value).b
        end
      end

      def msgpack(pairs)
        MessagePack.pack(pairs.transform_keys { |k| k.dup.force_encoding("UTF-8").scrub })
      rescue RangeError
        MessagePack.pack(pairs.keys.map(&:b))
      end

      def garbage(n) = Random.new(@r.rand(2**32)).bytes(n)

      def build(method, target, body: "", type: nil, headers: {}, parks: false, keep_alive: false)
        version = pick(VERSIONS)
        lines = ["#{method} #{target} #{version}".b, "Host: 127.0.0.1"]
        lines << "Connection: close" unless keep_alive
        lines << "Content-Type: #{type}".b if type
        lines << "Content-Length: #{body.bytesize}" unless body.empty? && chance(0.5)
        headers.each { |name, value| lines << "#{name}: #{value}".b }
        bytes = lines.map(&:b).join("\r\n") + "\r\n\r\n" + body.b
        Case.new(bytes: bytes, well_formed: !target.include?(" "), parks: parks) # a space splits the request line
      end

      def raw_request(method, target, version)
        Case.new(bytes: "#{method.b} #{target.b} #{version.b}\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".b,
          well_formed: false)
      end
    end
  end
end
