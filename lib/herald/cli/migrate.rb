# frozen_string_literal: true

module Herald
  module CLI
    # `herald migrate [--url URL] [--table PREFIX]`: creates the PostgreSQL store's tables and function
    # ahead of the first publish (for deploys where the app's database user may not create tables).
    class Migrate
      def initialize(argv, out:, err:)
        @out = out
        @url = ENV["DATABASE_URL"]
        @url = ENV["HERALD_STORE"] if ENV["HERALD_STORE"].to_s.match?(%r{\Apostgres(ql)?://})
        @table = "herald"
        OptionParser.new do |o|
          o.on("--url URL", "postgres:// URL (default $HERALD_STORE if postgres://, else $DATABASE_URL)") { |v| @url = v }
          o.on("--table PREFIX", "table name prefix (default herald)") { |v| @table = v }
        end.parse(argv).then { |rest| raise UsageError, "unexpected argument #{rest.first.inspect}" if rest.any? }
      end

      def run
        raise ArgumentError, "no database: pass --url postgres://... or set DATABASE_URL" unless @url
        store = Store::Postgres.new(url: @url, table: @table, migrate: false)
        store.migrate!
        @out.puts "herald migrate: #{@table}_* tables and #{@table}_append() are ready (schema version #{Store::Postgres::Schema::VERSION})"
        0
      rescue => e
        # PG is loaded with the store (autoload): naming PG::Error in a rescue clause would raise NameError
        # whenever the store was never built (no URL, no pg gem).
        raise unless defined?(::PG::Error) && e.is_a?(::PG::Error)
        raise ConnectionError, "PostgreSQL refused the migration: #{e.message.strip}"
      ensure
        store&.close
      end
    end
    register "migrate", Migrate, "migrate [--url URL] [--table PREFIX]", "create the PostgreSQL store's tables"
  end
end
