# frozen_string_literal: true

require "digest"

module Herald
  module Rack
    # Herald's browser client (built from js/ in the repository; the gem ships the built file) at
    # `GET {base}message-bus/herald.js`: a classic script defining `window.Herald` and a `window.MessageBus`
    # that pages written for message-bus.js use unchanged.
    module ClientScript
      NAME = "herald.js"
      PATH = File.expand_path("herald.js", __dir__)

      def self.call(env)
        body, etag = load
        return [304, {"cache-control" => "no-cache", "etag" => etag}, []] if env["HTTP_IF_NONE_MATCH"] == etag
        headers = {"content-type" => "text/javascript; charset=utf-8", "content-length" => body.bytesize.to_s,
                   "cache-control" => "no-cache", "etag" => etag}
        [200, headers, (env["REQUEST_METHOD"] == "HEAD") ? [] : [body]]
      end

      def self.load
        @load ||= begin
          body = File.binread(PATH).freeze
          [body, %("#{Digest::SHA256.hexdigest(body)[0, 32]}")].freeze
        end
      end

      def self.request?(env, client_id, action)
        client_id == NAME && action.nil? && %w[GET HEAD].include?(env["REQUEST_METHOD"])
      end
    end
  end
end
