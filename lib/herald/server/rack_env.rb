# frozen_string_literal: true

require "stringio"

module Herald
  class Server
    # Puma's parsed request (HttpConnection) made into the env the middleware and a Rack app need (Rack 3
    # SPEC; rack.version for Rack 2), and what the request says of its connection (keep-alive, path).
    class RackEnv
      SERVER_SOFTWARE = "Herald"
      RACK_VERSION = [1, 6].freeze

      # host, port: the listener's, for a request without a Host header. hijacker: #hijack(conn, env), called
      # when the middleware or the app takes the socket.
      def initialize(host:, port:, hijacker:)
        @host = host
        @server_port = port.to_s
        @hijacker = hijacker
      end

      def build(conn, env, body)
        env["PATH_INFO"] = path(env)
        env["QUERY_STRING"] ||= ""
        env["SCRIPT_NAME"] = ""
        env["SERVER_NAME"], env["SERVER_PORT"] = server_name(env["HTTP_HOST"])
        env["REMOTE_ADDR"] = conn.remote_addr
        env["SERVER_SOFTWARE"] = SERVER_SOFTWARE
        env["rack.version"] = RACK_VERSION
        env["rack.url_scheme"] = "http"
        env["rack.input"] = StringIO.new(body)
        env["rack.errors"] = $stderr
        env["rack.multithread"] = true
        env["rack.multiprocess"] = false
        env["rack.run_once"] = false
        env["rack.hijack?"] = true
        hijacker = @hijacker
        env["rack.hijack"] = -> { hijacker.hijack(conn, env) }
        env
      end

      # "GET http://host/path?q HTTP/1.1": Puma's parser leaves REQUEST_PATH out.
      def path(env) = env["REQUEST_PATH"] || absolute_path(env)

      def keep_alive?(env)
        connection = env["HTTP_CONNECTION"]
        http11 = env["SERVER_PROTOCOL"] == "HTTP/1.1"
        return http11 if connection.nil?
        if http11
          !connection.match?(/\bclose\b/i)
        else
          connection.match?(/\bkeep-alive\b/i)
        end
      end

      private

      def absolute_path(env)
        uri = env["REQUEST_URI"].to_s
        path = uri[%r{\A[a-z][a-z0-9+.-]*://[^/?#]*([^?#]*)}i, 1]
        raise HttpConnection::RequestRefused.new(400, "bad request target") if path.nil?
        path.empty? ? "/" : path
      end

      # SERVER_NAME and SERVER_PORT from the Host header; the last one is remembered (clients repeat it).
      def server_name(host)
        return @last_server_name if host == @last_host && host
        @last_host = host
        @last_server_name = parse_host(host)
      end

      def parse_host(host)
        return [@host, @server_port] if host.nil? || host.empty?
        if host.start_with?("[")
          name, port = host.split("]:", 2)
          return ["#{name.delete_suffix("]")}]", port || "80"]
        end
        name, port = host.split(":", 2)
        [name, port || "80"]
      end
    end
  end
end
