# frozen_string_literal: true

require "json"
require "cgi/escape"
require "stringio"

module Herald
  module Rack
    # What one poll asks for: channel => last id (nil = "from now"), and the client's `__seq`.
    # Parsed from a form or JSON body (docs/protocol.md 1.2), from `env["message_bus.channels"]` set by an
    # upstream middleware, or from the query string (SSE). Everything a client sends is checked here, so
    # bad input becomes a Herald::RequestError with a 4xx status and a short message, never a 500.
    class PollRequest
      INT64 = (-(2**63))..(2**63 - 1)
      MAX_CHANNEL_BYTES = 256
      INTEGER = /\A-?\d{1,19}\z/
      MULTIPART = %r{\Amultipart/form-data}i
      FORM_VARS = "rack.request.form_vars"

      attr_reader :channels, :seq

      def initialize(channels, seq)
        @channels = channels
        @seq = seq
      end

      # body: what .body returned for this env (read once for the reply cache's key and for the pairs).
      def self.from_env(env, max_body_bytes:, max_channels:, body: nil)
        if (forced = env["message_bus.channels"])
          return build(forced.merge("__seq" => env["message_bus.seq"].to_i), max_channels)
        end
        build(read_pairs(env, max_body_bytes, body), max_channels)
      end

      # The request body as .from_env parses it, read within the limit; nil when the channels do not come
      # from it (forced by an upstream middleware, or a multipart form that Rack may have parsed already).
      # type: env["CONTENT_TYPE"], when the caller has read it already (every env lookup hashes its key).
      # The String may be a StringIO's own (see #read_body): read it, never change it.
      def self.body(env, max_body_bytes, type = env["CONTENT_TYPE"])
        return nil if env.key?("message_bus.channels")
        # The regex only for a type starting with m (a regex match is ~10x a byte comparison; every poll asks).
        byte = type&.getbyte(0)
        return nil if (byte == 109 || byte == 77) && MULTIPART.match?(type)
        read_body(env, max_body_bytes)
      end

      # SSE: channels ride in the query string (EventSource can only GET), as `?/chat=5&/news=`.
      def self.from_query(query, max_channels:)
        raise RequestError.new("query string too long", status: 414) if query.bytesize > 16_384
        build(decode_form(query), max_channels)
      end

      def self.read_pairs(env, max_body_bytes, body = nil)
        type = env["CONTENT_TYPE"].to_s.downcase
        return read_multipart(env, max_body_bytes) if MULTIPART.match?(type)
        body ||= read_body(env, max_body_bytes)
        body = body.dup.force_encoding(Encoding::UTF_8) unless body.encoding == Encoding::UTF_8 # a StringIO's own
        return {} if body.empty?
        if type.include?("application/json")
          parse_json(body)
        elsif type.empty? || type.start_with?("application/x-www-form-urlencoded")
          decode_form(body)
        else
          raise RequestError.new("unsupported content type; send application/x-www-form-urlencoded or application/json", status: 415)
        end
      end

      def self.read_body(env, max)
        input = env["rack.input"]
        # A StringIO (Puma's for every body it buffered, Rack::MockRequest's) holds the whole body in memory: its
        # String is the body (as rewinding and reading it would give, without the copy), checked against the
        # limit here, never changed (its encoding is the StringIO's: #read_pairs copies it to UTF-8). Every poll
        # comes here, mostly to be answered from the ReplyCache: this skips parsing CONTENT_LENGTH, a String
        # and five calls (a fifth of what the middleware added to a cached reply between Puma's requests).
        if input.instance_of?(StringIO) && !env.key?(FORM_VARS)
          body = input.string
          raise RequestError.new("request body too large (max #{max} bytes)", status: 413) if body.bytesize > max
          return body
        end
        length = env["CONTENT_LENGTH"]&.to_i
        raise RequestError.new("request body too large (max #{max} bytes)", status: 413) if length && length > max
        # As much as the server says there is (one byte more shows a longer body): reading max + 1 makes Ruby
        # allocate that much, and in an app server's threads a 64 KiB buffer per poll grows and shrinks malloc's
        # arena (an mprotect syscall on most polls under Puma).
        body = (env.key?(FORM_VARS) && form_read_by_rack(env)) || read_input(input, (length && length > 0) ? length : max) or return ""
        raise RequestError.new("request body too large (max #{max} bytes)", status: 413) if body.bytesize > max
        body.force_encoding(Encoding::UTF_8)
      end

      # Rack::MethodOverride, first in every Rails app, parses a form body with Rack::Request#POST before we
      # run. On Rack 3 that reads rack.input to the end and leaves it there (it need not rewind); the raw
      # form it read is kept in the env, so take it from there (Rack 2 and 3.0 also say which input it was).
      def self.form_read_by_rack(env)
        vars = env[FORM_VARS] or return nil
        input = env["rack.request.form_input"]
        return nil if input && !input.equal?(env["rack.input"])
        vars.b
      end

      # An HTML form or a FormData posted as is. message_bus reads these through Rack::Request#POST, so we do
      # too: from the hash Rack::MethodOverride already parsed, else from the body read here within the limit.
      def self.read_multipart(env, max)
        pairs = multipart_read_by_rack(env) || parse_multipart(env, read_body(env, max).b)
        pairs.to_h { |key, value| [key.dup.force_encoding(Encoding::UTF_8), value.is_a?(String) ? value.dup.force_encoding(Encoding::UTF_8) : value] }
      end

      def self.multipart_read_by_rack(env)
        pairs = env["rack.request.form_hash"] or return nil
        input = env["rack.request.form_input"]
        return nil if input && !input.equal?(env["rack.input"])
        pairs
      end

      def self.parse_multipart(env, body)
        return {} if body.empty?
        parse_env = {"CONTENT_TYPE" => env["CONTENT_TYPE"], "CONTENT_LENGTH" => body.bytesize.to_s, "rack.input" => StringIO.new(body)}
        ::Rack::Multipart.parse_multipart(parse_env) || {}
      rescue => e # Rack's multipart errors differ between Rack 2 and 3 (EOFError, Rack::Multipart::Error, ...)
        raise RequestError, "malformed multipart body (#{e.class})"
      end

      # From the start: a middleware that read the body without caching it may have left it at the end.
      def self.read_input(input, max)
        return nil unless input
        input.rewind if input.respond_to?(:rewind)
        input.read(max + 1) || +""
      end

      def self.parse_json(body)
        raise RequestError, "request body is not valid UTF-8" unless body.valid_encoding?
        pairs = JSON.parse(body, max_nesting: 2)
        raise RequestError, "JSON body must be an object of channel => last id" unless pairs.is_a?(Hash)
        pairs
      rescue JSON::ParserError
        raise RequestError, "malformed JSON body"
      end

      # application/x-www-form-urlencoded, strictly: a bad %-escape or bytes that are not UTF-8 are refused
      # (URI.decode_www_form would silently replace them). No regex pass: every poll comes through here.
      def self.decode_form(body)
        body = body.b # split as bytes: a raw byte that is not UTF-8 is refused by #unescape, not raised on here
        body.split("&").each_with_object({}) do |pair, pairs|
          next if pair.empty?
          key, value = pair.split("=", 2)
          pairs[unescape(key)] = unescape(value.to_s)
        end
      end

      # True for the bytes of 0-9 A-F a-f, by byte value.
      HEX = Array.new(256) { |byte| byte.chr.match?(/\h/) }.freeze

      # + is a space and %XX a byte (CGI.unescape, in C); then the bytes must be UTF-8.
      def self.unescape(text)
        if text.include?("%")
          check_escapes!(text)
          text = CGI.unescape(text, Encoding::UTF_8)
        elsif text.include?("+")
          text = text.tr("+", " ")
        else
          text = text.b
        end
        text.force_encoding(Encoding::UTF_8)
        raise RequestError, "request is not valid UTF-8" unless text.valid_encoding?
        text
      end

      # Every % starts %XX (CGI.unescape leaves a bad one as it is; we refuse it).
      def self.check_escapes!(text)
        at = text.index("%")
        while at
          raise RequestError, "malformed form body" unless HEX[text.getbyte(at + 1).to_i] && HEX[text.getbyte(at + 2).to_i]
          at = text.index("%", at + 3)
        end
      end

      def self.build(pairs, max_channels)
        seq = 0
        channels = {}
        pairs.each do |key, value|
          if key == "__seq"
            seq = integer(value, "__seq") || 0
          else
            channels[channel!(key)] = integer(value, key)
          end
        end
        raise RequestError, "too many channels in one poll (max #{max_channels})" if channels.size > max_channels
        new(channels, seq)
      end

      def self.channel!(key)
        # As message_bus: any name, with or without a leading / (`abc=-1` is a poll on channel "abc").
        unless key.is_a?(String) && !key.empty? && key.bytesize <= MAX_CHANNEL_BYTES && key.valid_encoding?
          raise RequestError, "channel names are non-empty UTF-8 strings (max #{MAX_CHANNEL_BYTES} bytes)"
        end
        raise RequestError, "channel names must not contain #{Store::SITE_SEPARATOR}" if key.include?(Store::SITE_SEPARATOR)
        # ActionCable's broadcastings reach the clients its channels authorized, never a poll.
        raise RequestError.new("#{Cable::PREFIX}... channels are ActionCable's; subscribe through ActionCable", status: 403) if Cable.channel?(key)
        key
      end

      # nil or "" => nil ("from now"); integers and integer strings within 64 bits; anything else is refused.
      def self.integer(value, name)
        id = case value
        when nil, "" then return nil
        when Integer then value
        when String then value.match?(INTEGER) ? Integer(value, 10) : nil
        end
        return id if id && INT64.cover?(id)
        raise RequestError, "last id for #{name.to_s[0, 64]} must be an integer"
      end
    end
  end
end
