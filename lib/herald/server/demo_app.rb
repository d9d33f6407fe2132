# frozen_string_literal: true

require "json"
require "time"
require "uri"

module Herald
  class Server
    # The live demo behind `herald server`: a chat page at `/` fed by message_bus's own JS client
    # (served straight from the npm package in node_modules, never copied into our source) and a
    # POST /chat endpoint that publishes what the form sends. Everything else is 404.
    class DemoApp
      PUBLIC = File.expand_path("public", __dir__)
      CHANNEL = "/chat"
      MAX_TEXT = 2000
      # message_bus's client ships in the npm package message-bus-client (`npm ci` installs it).
      NODE_MODULES = ENV.fetch("HERALD_NODE_MODULES", File.expand_path("../../../node_modules", __dir__))
      ASSETS = {
        "/" => ["index.html", "text/html; charset=utf-8"],
        "/assets/demo.js" => ["demo.js", "text/javascript; charset=utf-8"],
        "/assets/demo.css" => ["demo.css", "text/css; charset=utf-8"],
        "/assets/message-bus-ajax.js" => ["message-bus-ajax.js", "text/javascript; charset=utf-8"],
        "/assets/message-bus.js" => [:client, "text/javascript; charset=utf-8"]
      }.freeze

      def initialize(bus:, node_modules: NODE_MODULES)
        @bus = bus
        @client_path = File.join(node_modules, "message-bus-client", "assets", "message-bus.js")
      end

      def call(env)
        path = env["PATH_INFO"]
        case env["REQUEST_METHOD"]
        when "GET", "HEAD" then asset(path)
        when "POST" then (path == CHANNEL) ? publish(env) : not_found
        else not_found
        end
      end

      private

      def asset(path)
        file, type = ASSETS[path]
        return not_found unless file
        file = (file == :client) ? @client_path : File.join(PUBLIC, file)
        unless File.file?(file)
          return text(503, "#{file} is missing: run `npm ci` in the Herald checkout (it installs message-bus-client)")
        end
        [200, {"content-type" => type, "cache-control" => "no-cache"}, [File.binread(file)]]
      end

      # Form (the page) or JSON body: {"name": ..., "text": ...}. Replies 201 with the message id.
      def publish(env)
        fields = parse(env)
        text = fields["text"].to_s.strip
        return text(422, "text is required") if text.empty?
        return text(413, "text is longer than #{MAX_TEXT} characters") if text.length > MAX_TEXT
        name = fields["name"].to_s.strip[0, 40]
        data = {"text" => text, "name" => name.empty? ? "anonymous" : name, "at" => Time.now.utc.iso8601(3)}
        id = @bus.publish(CHANNEL, data)
        [201, {"content-type" => "application/json"}, [JSON.generate("message_id" => id)]]
      rescue JSON::ParserError, ArgumentError, EncodingError
        text(400, "send a form (name, text) or a JSON object")
      end

      def parse(env)
        body = env["rack.input"].read(MAX_TEXT * 4).to_s
        fields = if env["CONTENT_TYPE"].to_s.include?("json")
          JSON.parse(body)
        else
          URI.decode_www_form(body).to_h
        end
        raise ArgumentError unless fields.is_a?(Hash)
        fields.transform_values { |v| v.to_s.encode("UTF-8") }.each_value { |v| raise ArgumentError unless v.valid_encoding? }
      end

      def text(status, message) = [status, {"content-type" => "text/plain; charset=utf-8"}, [message + "\n"]]

      def not_found = text(404, "not found")
    end
  end
end
