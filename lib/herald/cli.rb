# frozen_string_literal: true

require "optparse"
require "json"
require "pathname"

module Herald
  # `herald COMMAND ...`: each command is a small class under Herald::CLI, registered in COMMANDS.
  #
  # A user's mistake or a failure the user can act on is one line on standard error, never a backtrace:
  # wrong arguments or options exit 2 (with the command's usage line when the call itself is malformed),
  # failures while running (store, file system, network, a missing gem) exit 1.
  module CLI
    COMMANDS = {}
    USAGES = {}

    # The call itself is malformed (missing or extra arguments): the usage line follows the message.
    class UsageError < ArgumentError; end

    # Gems Herald loads only when asked for (a redis:// or postgres:// store): the feature to require => gem name.
    OPTIONAL_GEMS = {"redis-client" => "redis-client", "redis_client" => "redis-client", "pg" => "pg"}.freeze

    def self.register(name, command, synopsis, description)
      COMMANDS[name] = command
      USAGES[name] = [synopsis, description]
    end

    def self.usage
      lines = USAGES.values.map do |synopsis, description|
        (synopsis.size < 35) ? "  #{synopsis.ljust(35)}#{description}" : "  #{synopsis}\n#{" " * 37}#{description}"
      end
      "Usage: herald COMMAND [options]\n\nCommands:\n#{lines.join("\n")}\n"
    end

    def self.run(argv, out: $stdout, err: $stderr)
      argv = utf8(argv)
      name = argv.first
      return help(out) if %w[help -h --help].include?(name)
      command = COMMANDS[name]
      unless command
        err.puts(name ? "herald: unknown command #{name.inspect}\n\n#{usage}" : usage)
        return 2
      end
      command.new(argv.drop(1), out: out, err: err).run || 0
    rescue OptionParser::ParseError, UsageError => e
      err.puts one_line(name, e.message), "usage: herald #{USAGES[name][0]}"
      2
    rescue ArgumentError, InvalidArgumentError => e # what was given is refused: a usage error
      err.puts one_line(name, e.message)
      2
    rescue Herald::Error, SystemCallError, SocketError, IOError, ScriptError => e
      err.puts one_line(name, failure(e))
      1
    rescue Interrupt
      130
    end

    # Some messages span lines (libpq adds "\tIs the server running...?"): one line, for scripts and logs.
    def self.one_line(name, message)
      "#{COMMANDS[name] ? "herald #{name}" : "herald"}: #{message.lines.map(&:strip).reject(&:empty?).join(" ")}"
    end

    def self.help(out)
      out.puts usage
      0
    end

    # Arguments are bytes in the locale's encoding (ASCII-8BIT under LANG=C): Herald's channels and JSON
    # are UTF-8, and a channel name in another encoding would be a different Hash key.
    def self.utf8(argv)
      argv.each_with_index.map do |arg, i|
        arg = arg.dup.force_encoding(Encoding::UTF_8)
        raise ArgumentError, "argument #{i + 1} is not valid UTF-8: #{arg.b.inspect}" unless arg.valid_encoding?
        arg
      end
    end

    def self.failure(error)
      case error
      when LoadError then missing_gem(error)
      when SystemCallError then error.message.sub(/ @ \w+ -/, " -") # drop the C function name
      when ScriptError then error.message.lines.first
      else error.message
      end
    end

    def self.missing_gem(error)
      gem = OPTIONAL_GEMS[error.path.to_s]
      return error.message unless gem
      "this needs the #{gem} gem: add `gem \"#{gem}\"` to your Gemfile (or gem install #{gem})"
    end

    # Shared by commands: options parsing and the store they point at.
    class Command
      def initialize(argv, out:, err:)
        @out = out
        @err = err
        @options = {dir: ENV.fetch("HERALD_DIR", Store::Log::DEFAULT_DIR)} # checked below, with the flag's name
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
        return Store::Log.new(dir: log_dir) if @dir_given || ENV["HERALD_STORE"].to_s.empty?
        Store.from_url(ENV["HERALD_STORE"])
      end

      # Refused before anything is created: "" would put the log in the current directory.
      def log_dir
        dir = @options[:dir]
        source = @dir_given ? "--dir" : "HERALD_DIR"
        raise ArgumentError, "#{source} is empty: name a directory (default ./herald-data)" if dir.empty?
        blocker = Pathname(dir).expand_path.ascend.find(&:exist?)
        raise ArgumentError, "#{source} #{dir}: #{blocker} is not a directory" unless blocker.directory?
        dir
      end

      def arg!(index, name)
        @args[index] or raise UsageError, "missing #{name}"
      end

      # Extra arguments are a mistake (a JSON argument split by the shell, an option after a typo).
      def no_more_than!(count)
        raise UsageError, "unexpected argument #{@args[count].inspect}" if @args.size > count
      end
    end

    class Publish < Command
      def run
        no_more_than!(2)
        channel = arg!(0, "CHANNEL")
        data = JSON.parse(arg!(1, "JSON"))
        @out.puts bus.publish(channel, data)
      rescue JSON::ParserError => e
        raise ArgumentError, "JSON is not valid: #{e.message.lines.first.strip}"
      ensure
        @bus&.close
      end
    end
    register "publish", Publish, "publish CHANNEL JSON [--dir DIR]", "append one message (JSON text) to a channel"

    # Prints each new message's data as one line of JSON; --from ID first prints what is retained after ID.
    class Tail < Command
      def run
        no_more_than!(1)
        channel = arg!(0, "CHANNEL")
        @out.sync = true
        done = Queue.new
        %w[INT TERM].each { |sig| trap(sig) { done << true } }
        hint_at_slash(channel)
        bus.subscribe(channel, @options[:from], site_id: @options[:site]) do |msg|
          @out.puts JSON.generate(msg.data)
        rescue Errno::EPIPE # `herald tail /chat | head -1`: the reader is gone
          done << true
        end
        done.pop
        0
      ensure
        @bus&.close
      end

      private

      def parser
        super.tap do |o|
          o.on("--from ID", Integer, "print the retained messages after ID first (0: all of them)") do |v|
            raise OptionParser::InvalidArgument, "#{v} (must be >= 0)" if v < 0
            @options[:from] = v
          end
          o.on("--site SITE", "the channel of one site (message_bus's site_id; default: published without one)") { |v| @options[:site] = v }
        end
      end

      # `tail chat` is a legal channel, but the demo and the README use "/chat": a quiet channel whose
      # name lacks the slash is most likely a typo, and tail would otherwise wait forever without a word.
      # The other way round (`tail /news` when only "news" has messages) gets the same note.
      def hint_at_slash(channel)
        return if bus.last_id(channel, site_id: @options[:site]) > 0
        other = channel.start_with?("/") ? channel.delete_prefix("/") : "/#{channel}"
        return if channel.start_with?("/") && (other.empty? || bus.last_id(other, site_id: @options[:site]).zero?)
        @err.puts "note: channel #{channel.inspect} is empty; did you mean #{other.inspect}?"
      end
    end
    register "tail", Tail, "tail CHANNEL [--from ID] [--site SITE] [--dir DIR]", "print new messages on a channel as they arrive"

    # The main job: Herald's HTTP front end (or Puma, --puma) + Herald::Rack::Middleware + the demo page, on the
    # embedded log (lib/herald/server.rb).
    class Server < Command
      def run
        no_more_than!(0)
        require_relative "server"
        workers = @options.delete(:workers) || 1
        return Herald::Server::Workers.new(workers, **@options, dir: log_dir, log: @out).run if workers > 1
        Herald::Server.new(**@options, dir: log_dir, log: @out).run
        0
      end

      private

      def parser
        super.tap do |o|
          o.on("--port PORT", Integer, "TCP port, 0 for any free one (default 9292)") { |v| @options[:port] = within(v, 0..65_535) }
          o.on("--host HOST", "address to bind (default 127.0.0.1)") { |v| @options[:host] = v }
          o.on("--threads N", Integer, "threads for requests other than message-bus polls (default 5)") { |v| @options[:threads] = within(v, 1..) }
          o.on("--puma", "Puma in front of the middleware instead of Herald's own event loop") { @options[:front] = :puma }
          o.on("--workers N", Integer, "server processes on the port (SO_REUSEPORT), parked clients spread over them (default 1)") { |v| @options[:workers] = within(v, 1..64) }
        end
      end

      def within(value, range)
        return value if range.cover?(value)
        raise OptionParser::InvalidArgument, "#{value} (must be #{range.end ? "#{range.begin}..#{range.end}" : ">= #{range.begin}"})"
      end
    end
    register "server", Server, "server [--port 9292] [--host 127.0.0.1] [--dir DIR] [--threads 5] [--puma] [--workers 1]",
      "HTTP server: message_bus endpoint + live demo page at /"
  end
end
require_relative "cli/check"
require_relative "cli/events"
require_relative "cli/migrate"
