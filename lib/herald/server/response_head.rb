# frozen_string_literal: true

require "puma/const" # Puma::HTTP_STATUS_CODES

module Herald
  class Server
    # The status line and headers of a reply, as the front writes them: from the loop for Array bodies, from
    # a pool thread for streaming ones. Rack 3 values may hold several lines ("a\nb"); rack.* keys are not
    # headers; framing (content-length, transfer-encoding, connection) is the front's.
    class ResponseHead
      STATUS = Puma::HTTP_STATUS_CODES
      NO_BODY = [204, 304].freeze
      # Headers the front end writes itself (rack.* are not headers); content-length is kept when the app set it.
      FRAMING = /\A(?:rack\.|connection\z|transfer-encoding\z|content-length\z)/i

      def self.body_length(body) = body.is_a?(Array) ? body.sum(&:bytesize) : nil

      def self.error_response(status, detail = "")
        [status, {"content-type" => "text/plain; charset=utf-8"}, ["#{status} #{STATUS[status]}#{detail}\n"]]
      end

      def self.bodyless?(env, status) = env["REQUEST_METHOD"] == "HEAD" || NO_BODY.include?(status)

      def initialize
        @status_lines = {}
      end

      # A mutable String: the caller appends the body.
      def call(env, status, headers, length, keep, chunked: false)
        version = (env["SERVER_PROTOCOL"] == "HTTP/1.0") ? "HTTP/1.0" : "HTTP/1.1"
        out = +(@status_lines[[version, status]] ||= "#{version} #{status} #{STATUS[status] || "CUSTOM"}\r\n".b.freeze)
        has_length = fields(out, headers)
        out << "content-length: " << length.to_s << "\r\n" if length && !has_length && !NO_BODY.include?(status)
        out << "transfer-encoding: chunked\r\n" if chunked
        if !keep
          out << "connection: close\r\n"
        elsif version == "HTTP/1.0"
          out << "connection: keep-alive\r\n"
        end
        out << "\r\n"
      end

      private

      # Appends the app's headers but the framing ones; true when the app set content-length.
      def fields(out, headers)
        has_length = false
        headers.each do |name, value|
          name = name.to_s
          if FRAMING.match?(name)
            next unless name.downcase == "content-length"
            has_length = true
          end
          if value.is_a?(String) && !value.include?("\n")
            out << name << ": " << value << "\r\n"
          else
            (value.is_a?(Array) ? value : value.to_s.split("\n")).each { |line| out << name << ": " << line.to_s << "\r\n" }
          end
        end
        has_length
      end
    end
  end
end
