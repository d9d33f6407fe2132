# frozen_string_literal: true

module Herald
  module Rails
    # In front of Rails::Rack::Logger: a poll's request line ("Started POST /message-bus/<client id>/poll")
    # would flood the log and print the client id, a bearer token. Polls run with the Rails logger silenced
    # below WARN on this thread only; errors still reach the log.
    class QuietPolls
      def initialize(app, base_route: nil)
        @app = app
        @prefix = "#{(base_route || "/").to_s.gsub(%r{\A(?!/)|(?<!/)\z|//+}, "/")}message-bus/"
      end

      def call(env)
        logger = ::Rails.logger
        return @app.call(env) unless env["PATH_INFO"].to_s.start_with?(@prefix) && logger.respond_to?(:silence)
        logger.silence(::Logger::WARN) { @app.call(env) }
      end
    end
  end
end
