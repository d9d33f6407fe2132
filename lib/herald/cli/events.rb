# frozen_string_literal: true

module Herald
  module CLI
    # herald dead [SUBSCRIBER] [--dir DIR]: lists dead letters, oldest first, one per line.
    class Dead < Command
      def run
        no_more_than!(1)
        letters = Events::DeadLetters.new(bus.store).list(@args[0])
        letters.each do |l|
          @out.puts "#{l.subscriber} ##{l.id}: #{l.channel} global_id=#{l.global_id} after #{l.attempts} attempts: " \
            "#{l.error}: #{l.error_message}"
        end
        @out.puts "#{letters.size} dead letters"
        0
      ensure
        @bus&.close
      end
    end
    register "dead", Dead, "dead [SUBSCRIBER] [--dir DIR]", "list events deferred subscribers gave up on"

    # herald replay SUBSCRIBER [--from ID] [--require FILE]... [--dir DIR]: runs the subscriber's handler
    # again on its dead letters with id >= ID. The app's subscriber and event classes must be loaded:
    # --require the files that define them. Exit status 1 when any replay failed again.
    class Replay < Command
      def run
        no_more_than!(1)
        @options[:requires].each { |f| require File.expand_path(f) }
        subscriber = Events.registry.find(arg!(0, "SUBSCRIBER"))
        results = Events::DeadLetters.new(store).replay(subscriber, from: @options[:from])
        results.each do |letter, error|
          status = error ? "failed again: #{Events::Delivery.describe(error)}" : "ok"
          @out.puts "#{letter.subscriber} ##{letter.id} (global_id=#{letter.global_id}): #{status}"
        end
        @out.puts "#{results.count { |_, e| e.nil? }} replayed, #{results.count { |_, e| e }} failed"
        (results.any? { |_, e| e }) ? 1 : 0
      end

      private

      def parser
        @options[:from] = 1
        @options[:requires] = []
        super.tap do |o|
          o.on("--from ID", Integer, "first dead letter id to replay (default 1)") { |v| @options[:from] = v }
          o.on("-r", "--require FILE", "load the app's subscriber and event classes") do |v|
            raise OptionParser::InvalidArgument, "#{v} (no such file)" unless File.file?(v)
            @options[:requires] << v
          end
        end
      end

      # The handler may publish: it gets Herald's default bus on the same log unless the app set one up.
      def store
        Herald.configure { |c| c.store = Store::Log.new(dir: log_dir) }
        Herald.bus.store
      rescue ConfigurationError
        Herald.bus.store
      end
    end
    register "replay", Replay, "replay SUBSCRIBER [--from ID] [-r FILE] [--dir DIR]", "re-run a subscriber on its dead letters with id >= ID"
  end
end
