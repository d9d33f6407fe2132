# frozen_string_literal: true

require "puma/log_writer"
require "puma/null_io"

module Herald
  class Server
    # Puma's log writer for `herald server`: Puma's own output is silenced (the server prints its one
    # "listening" line itself), but every error Puma catches goes to Herald.logger, so a 500 is never
    # silent. An exception in the app is an ERROR with its backtrace; a request Puma itself failed on while
    # reading it is a WARN (answered 400); one it cannot parse was the client's fault and already answered
    # 400, so it is only a DEBUG line.
    class PumaLog < Puma::LogWriter
      BACKTRACE_LINES = 8

      def initialize
        null = Puma::NullIO.new
        super(null, null)
      end

      # Every 5xx Puma answers: a Rack app that raised ("Rack app"), a listener error. A request Puma failed
      # to read was answered 400 (Server::LOWLEVEL_ERROR): a WARN, with where Puma failed.
      def unknown_error(error, req = nil, text = "Unknown error")
        if text == "Read"
          return Herald.logger.warn("http server: a request Puma could not read was refused (400): #{error.class}: " \
            "#{clean(error.message)} (#{Array(error.backtrace).first})")
        end
        Herald.logger.error("http server: #{text}: #{error.class}: #{clean(error.message)}#{request_of(req)}\n  " \
          "#{Array(error.backtrace).first(BACKTRACE_LINES).join("\n  ")}")
      end

      def parse_error(error, req)
        Herald.logger.debug("http server: malformed request refused: #{clean(error.message)}#{request_of(req)}")
      end

      def ssl_error(error, _socket) = Herald.logger.warn("http server: TLS error: #{error.class}: #{clean(error.message)}")

      def connection_error(error, req, text = "connection error")
        Herald.logger.debug("http server: #{text}: #{error.class}#{request_of(req)}")
      end

      def debug_error(error, req = nil, text = "")
        Herald.logger.debug("http server: #{text} #{error.class}: #{clean(error.message)}#{request_of(req)}")
      end

      def log(str) = Herald.logger.debug("http server: #{str}")

      # Puma calls this on a fatal configuration error, then exits.
      def error(str)
        Herald.logger.fatal("http server: #{str}")
        super
      end

      private

      # A message may quote request bytes (not UTF-8, control characters, whole header blocks): a log entry
      # stays one line of valid UTF-8 of bounded length.
      def clean(text) = text.to_s.dup.force_encoding(Encoding::UTF_8).scrub.gsub(/[[:cntrl:]]+/, " ")[0, 500]

      # " (POST /message-bus/...)" from a Puma::Client; the path is inspected, it may hold any bytes.
      def request_of(req)
        env = req.respond_to?(:env) ? req.env : req
        return "" unless env.is_a?(Hash) && env["REQUEST_METHOD"]
        path = env["REQUEST_PATH"] || env["PATH_INFO"]
        " (#{env["REQUEST_METHOD"].to_s.b.inspect[1..-2]} #{path.to_s.b[0, 200].inspect[1..-2]})"
      end
    end
  end
end
