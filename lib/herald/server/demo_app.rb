# frozen_string_literal: true

require "json"
require "time"
require "uri"

module Herald
  class Server
    # The live demo behind `herald server`: a chat page at `/` fed by Herald's browser client (served by
    # the middleware at /message-bus/herald.js), a POST /chat endpoint that publishes what the form sends,
    # and message_bus's own JS client at /assets/message-bus.js (straight from the npm package in
    # node_modules, never copied into our source) for pages that compare the two. The dashboard
    # (Herald::Web) at /herald, on the same bus. Everything else is 404.
    class DemoApp
      PUBLIC = File.expand_path("public", __dir__)
      CHANNEL = "/chat"
      MAX_TEXT = 2000
      MAX_BODY = 64 * 1024 # room for MAX_TEXT emoji percent-escaped (12 bytes each) and a name
      # message_bus's client ships in the npm package message-bus-client (`npm ci` installs it).
      NODE_MODULES = ENV.fetch("HERALD_NODE_MODULES", File.expand_path("../../../node_modules", __dir__))
      ASSETS = {
        "/" => ["index.html", "text/html; charset=utf-8"],
        "/assets/demo.js" => ["demo.js", "text/javascript; charset=utf-8"],
        "/assets/demo.css" => ["demo.css", "text/css; charset=utf-8"],
        "/assets/message-bus-ajax.js" => ["message-bus-ajax.js", "text/javascript; charset=utf-8"],
        "/assets/message-bus.js" => [:client, "text/javascript; charset=utf-8"]
      }.freeze

      DASHBOARD = "/herald"

      def initialize(bus:, node_modules: NODE_MODULES)
        @bus = bus
        @dashboard = Web.new(bus: bus)
        @client_path = File.join(node_modules, "message-bus-client", "assets", "message-bus.js")
      end

      def call(env)
        path = env["PATH_INFO"]
        return dashboard(env, path) if path == DASHBOARD || path.start_with?("#{DASHBOARD}/")
        case env["REQUEST_METHOD"]
        when "GET", "HEAD" then asset(path)
        when "POST" then (path == CHANNEL) ? publish(env) : not_found
        else not_found
        end
      end

      private

      # As Rails' mount and Rack's map pass it: the mount point moves from PATH_INFO to SCRIPT_NAME.
      def dashboard(env, path)
        @dashboard.call(env.merge("SCRIPT_NAME" => "#{env["SCRIPT_NAME"]}#{DASHBOARD}", "PATH_INFO" => path.delete_prefix(DASHBOARD)))
      end

      def asset(path)
        file, type = ASSETS[path]
        return not_found unless file
        file = (file == :client) ? @client_path : File.join(PUBLIC, file)
        unless File.file?(file)
          return text(503, "#{file} is missing: run `npm ci` in the Herald checkout (it installs message-bus-client)")
        end
        [200, {"content-type" => type, "cache-control" => "no-cache"}, [File.binread(file)]]
      end

      # Form (the page) or JSON body: {"name": ..., "text": ...}, both strings (name optional). Replies 201
      # with the message id; 4xx with a short reason for what the client sent. A failing publish is not the
      # client's fault: it raises, so the server answers 500 and logs it.
      def publish(env)
        fields = parse(env) or return text(400, "send a form (name, text) or a JSON object of strings, in UTF-8")
        return text(413, "send at most #{MAX_BODY} bytes") if fields == :too_large
        text = fields["text"].to_s.strip
        return text(422, "text is required") if text.empty?
        return text(413, "text is longer than #{MAX_TEXT} characters") if text.length > MAX_TEXT
        name = fields["name"].to_s.strip[0, 40]
        data = {"text" => text, "name" => name.empty? ? "anonymous" : name, "at" => Time.now.utc.iso8601(3)}
        id = @bus.publish(CHANNEL, data)
        [201, {"content-type" => "application/json"}, [JSON.generate("message_id" => id)]]
      end

      # The fields as UTF-8 strings; nil when they are not a form or JSON object of strings (JSON null is
      # an absent field). Never the #inspect or #to_s of something else.
      def parse(env)
        body = env["rack.input"].read(MAX_BODY + 1).to_s.b
        return :too_large if body.bytesize > MAX_BODY
        fields = env["CONTENT_TYPE"].to_s.include?("json") ? JSON.parse(body.force_encoding(Encoding::UTF_8)) : form(body)
        return nil unless fields.is_a?(Hash)
        fields = fields.slice("name", "text").compact
        fields if fields.each_value.all? { |v| v.is_a?(String) && v.valid_encoding? }
      rescue JSON::ParserError, ArgumentError
        nil
      end

      # application/x-www-form-urlencoded as any client sends it: percent-escaped (browsers) or raw UTF-8
      # bytes (`curl -d 'text=héllo'`). URI.decode_www_form refuses the latter; a bad escape is an ArgumentError.
      def form(body)
        body.split("&").each_with_object({}) do |pair, fields|
          key, value = pair.split("=", 2).map { |part| URI.decode_www_form_component(part.to_s) }
          fields[key] = value.to_s unless key.nil?
        end
      end

      def text(status, message) = [status, {"content-type" => "text/plain; charset=utf-8"}, [message + "\n"]]

      def not_found = text(404, "not found")
    end
  end
end
