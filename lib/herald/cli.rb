# frozen_string_literal: true

require "optparse"
require "json"

module Herald
  # `herald COMMAND ...`: each command is a small class under Herald::CLI, registered in COMMANDS.
  module CLI
    COMMANDS = {}

    USAGE = +<<~TEXT
      Usage: herald COMMAND [options]

      Commands:
        publish CHANNEL JSON [--dir DIR]   append one message (JSON text) to a channel
        tail CHANNEL [--dir DIR]           print new messages on a channel as they arrive
        server [--port 9292] [--host 127.0.0.1] [--dir DIR] [--threads 5]
                                           HTTP server: message_bus endpoint + live demo page at /
    TEXT

    def self.register(name, command, usage = nil)
      COMMANDS[name] = command
      USAGE << "  #{usage}\n" if usage
    end

    def self.run(argv, out: $stdout, err: $stderr)
      name = argv.first
      command = COMMANDS[name]
      unless command
        err.puts(name ? "herald: unknown command #{name.inspect}\n\n#{USAGE}" : USAGE)
        return 2
      end
      command.new(argv.drop(1), out: out, err: err).run || 0
    rescue OptionParser::ParseError, ArgumentError, Herald::Error => e
      err.puts "herald #{name}: #{e.message}"
      e.is_a?(Herald::Error) ? 1 : 2
    end

    # Shared by commands: options parsing and the store they point at.
    class Command
      def initialize(argv, out:, err:)
        @out = out
        @err = err
        @options = {dir: Store::Log.default_dir}
        @args = parser.parse(argv)
      end

      private

      def parser
        OptionParser.new do |o|
          o.on("--dir DIR", "log directory (default ./herald-data, or $HERALD_DIR)") { |v| @options[:dir] = @dir_given = v }
        end
      end

      # --dir wins; else $HERALD_STORE (a redis://, postgres:// URL or a directory), as Herald.configure reads it.
      def bus = @bus ||= Bus.new(store: store)

      def store
        return Store::Log.new(dir: @options[:dir]) if @dir_given || ENV["HERALD_STORE"].to_s.empty?
        Store.from_url(ENV["HERALD_STORE"])
      end

      def arg!(index, name)
        @args[index] or raise ArgumentError, "missing #{name}"
      end
    end

    class Publish < Command
      def run
        channel = arg!(0, "CHANNEL")
        data = JSON.parse(arg!(1, "JSON"))
        @out.puts bus.publish(channel, data)
      rescue JSON::ParserError => e
        raise ArgumentError, "JSON is not valid: #{e.message.lines.first.strip}"
      ensure
        @bus&.close
      end
    end
    register "publish", Publish

    class Tail < Command
      def run
        channel = arg!(0, "CHANNEL")
        @out.sync = true
        done = Queue.new
        %w[INT TERM].each { |sig| trap(sig) { done << true } }
        bus.subscribe(channel) { |msg| @out.puts JSON.generate(msg.data) }
        done.pop
        bus.close
        0
      end
    end
    register "tail", Tail

    # The main job: Puma + Herald::Rack::Middleware + the demo page, on the embedded log (lib/herald/server.rb).
    class Server < Command
      def run
        require_relative "server"
        Herald::Server.new(**@options, log: @out).run
        0
      end

      private

      def parser
        super.tap do |o|
          o.on("--port PORT", Integer, "TCP port (default 9292)") { |v| @options[:port] = v }
          o.on("--host HOST", "address to bind (default 127.0.0.1)") { |v| @options[:host] = v }
          o.on("--threads N", Integer, "Puma threads for short requests (default 5)") { |v| @options[:threads] = v }
        end
      end
    end
    register "server", Server
  end
end
require_relative "cli/check"
require_relative "cli/events"
require_relative "cli/migrate"
