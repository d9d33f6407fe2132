# frozen_string_literal: true

require "socket"
require "tmpdir"
require "fileutils"
require "uri"

module Herald
  # Real redis-server and PostgreSQL for the tests and benchmarks: started once per process on free
  # loopback ports in temporary directories, stopped at exit. REDIS_URL / DATABASE_URL, when set, are
  # used instead. Missing binaries: a loud message naming the Debian packages; with ENV["CI"], a failure.
  module TestServers
    # Debian's PostgreSQL: 15 on bookworm, 17 on trixie (bin/ruby33's root); the newest installed.
    PG_BIN = ENV.fetch("PG_BIN") { Dir["/usr/lib/postgresql/*/bin"].max_by { |d| d[%r{/(\d+)/bin\z}, 1].to_i } || "/usr/lib/postgresql/15/bin" }
    INSTALL = "apt-get install redis-server postgresql"

    class Unavailable < StandardError; end

    @urls = {}
    @lock = Mutex.new

    class << self
      def redis_url = ENV["REDIS_URL"] || start(:redis) { start_redis }

      def postgres_url = ENV["DATABASE_URL"] || start(:postgres) { start_postgres }

      # Kills and restarts the spawned redis-server on the same port (data is not persisted: a reset).
      def restart_redis!
        server = @urls.fetch(:redis) { raise Unavailable, "restart_redis! needs the spawned redis-server" }
        stop(server[:pid])
        server[:pid] = spawn_redis(server[:port], server[:dir])
        wait_for_port(server[:port])
      end

      # A second redis-server replicating the first: it answers writes with READONLY.
      def redis_replica_url
        primary = URI(redis_url)
        start(:replica) do
          port = free_port
          dir = Dir.mktmpdir("herald-redis-replica")
          pid = spawn_redis(port, dir, "--replicaof", primary.host, primary.port.to_s)
          wait_for_port(port)
          at_exit { stop(pid) && FileUtils.rm_rf(dir) }
          {url: "redis://127.0.0.1:#{port}/0", pid: pid}
        end
      end

      # A redis-server of the test's own (a fault that must not disturb the shared one: a reload, a stalled
      # or killed server, persistence settings). Stopped at exit; `restart_redis_server!` keeps its port/dir.
      def redis_server(*extra)
        raise Unavailable, "redis-server not found: #{INSTALL}" unless system("command -v redis-server >/dev/null 2>&1")
        port = free_port
        dir = Dir.mktmpdir("herald-redis-own")
        server = {url: "redis://127.0.0.1:#{port}/0", port: port, dir: dir, extra: extra, pid: spawn_redis(port, dir, *extra)}
        wait_for_port(port)
        at_exit { stop(server[:pid]) && FileUtils.rm_rf(dir) }
        server
      end

      # SIGKILLs the server and starts it again on the same port and directory: with `appendonly yes` it
      # replays its AOF, without persistence it comes back empty.
      def restart_redis_server!(server, signal: :KILL, down_for: 0)
        stop(server[:pid], signal)
        sleep down_for
        server[:pid] = spawn_redis(server[:port], server[:dir], *server[:extra])
        wait_for_port(server[:port])
      end

      # A PostgreSQL of the test's own, committing synchronously (an acknowledged publish survives a crash of
      # the server), for faults that must not disturb the shared one. Stopped at exit.
      def postgres_server
        server = start_postgres
        raise Unavailable, server[:error] if server[:error]
        stop(server[:pid], :INT)
        server[:pid] = spawn_postgres(server[:port], server[:dir])
        at_exit { stop(server[:pid], :INT) }
        server
      end

      # `pg_ctl stop -m immediate` (SIGQUIT to the postmaster: no checkpoint), then a start that recovers.
      def crash_postgres_server!(server)
        stop(server[:pid], :QUIT)
        server[:pid] = spawn_postgres(server[:port], server[:dir])
      end

      # For a test's setup: the server's URL, or skip (loudly, naming the packages) / fail in CI.
      def require!(test, kind)
        (kind == :redis) ? redis_url : postgres_url
      rescue Unavailable => e
        ENV["CI"] ? test.flunk(e.message) : test.skip(e.message)
      end

      def spawned_redis? = !ENV["REDIS_URL"] && @urls.key?(:redis)

      private

      def start(kind)
        @lock.synchronize do
          server = (@urls[kind] ||= yield)
          raise Unavailable, server[:error] if server[:error]
          server[:url]
        end
      end

      def missing(what)
        message = "#{what} not found: install it with `#{INSTALL}` (or set REDIS_URL / DATABASE_URL)"
        warn "\n!!! #{message}\n" unless ENV["CI"]
        {error: message}
      end

      def start_redis
        return missing("redis-server") unless system("command -v redis-server >/dev/null 2>&1")
        port = free_port
        dir = Dir.mktmpdir("herald-redis")
        pid = spawn_redis(port, dir)
        wait_for_port(port)
        at_exit { stop(@urls[:redis][:pid]) && FileUtils.rm_rf(dir) }
        {url: "redis://127.0.0.1:#{port}/0", port: port, dir: dir, pid: pid}
      end

      def spawn_redis(port, dir, *extra)
        Process.spawn("redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "",
          "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--loglevel", "warning", *extra,
          out: File::NULL, err: File::NULL)
      end

      def start_postgres
        return missing("PostgreSQL (#{PG_BIN}/postgres)") unless File.executable?(File.join(PG_BIN, "postgres"))
        port = free_port
        dir = Dir.mktmpdir("herald-pg")
        FileUtils.chown("postgres", "postgres", dir) if Process.uid.zero?
        as_pg(File.join(PG_BIN, "initdb"), "-D", "#{dir}/data", "-A", "trust", "-U", "herald", "--no-sync",
          "-E", "UTF8", "--locale", "C", out: File::NULL, err: File::NULL) or raise Unavailable, "initdb failed in #{dir}"
        pid = spawn_postgres(port, dir, "synchronous_commit=off")
        at_exit { stop(pid, :INT) && FileUtils.rm_rf(dir) }
        {url: "postgres://herald@127.0.0.1:#{port}/postgres", port: port, dir: dir, pid: pid}
      end

      # fsync=off still keeps what was written across a crash of the server process (not of the machine).
      def spawn_postgres(port, dir, *settings)
        pid = Process.spawn(*pg_prefix, File.join(PG_BIN, "postgres"), "-D", "#{dir}/data", "-p", port.to_s,
          "-h", "127.0.0.1", "-k", dir, "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
          *settings.flat_map { |setting| ["-c", setting] }, out: File::NULL, err: "#{dir}/log")
        wait_for_port(port)
        wait_until_accepting(port)
        pid
      end

      # PostgreSQL refuses to run as root: run it as the postgres user. setpriv execs (no parent process in between), so signals reach postgres itself.
      def pg_prefix = Process.uid.zero? ? ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"] : []

      def as_pg(*cmd, **opts) = system(*pg_prefix, *cmd, **opts)

      def free_port
        server = TCPServer.new("127.0.0.1", 0)
        server.addr[1]
      ensure
        server&.close
      end

      def wait_for_port(port, timeout: 10)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        begin
          TCPSocket.new("127.0.0.1", port).close
        rescue SystemCallError
          raise Unavailable, "server on port #{port} did not start" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          sleep 0.02
          retry
        end
      end

      # The port opens before PostgreSQL accepts sessions ("the database system is starting up").
      def wait_until_accepting(port, timeout: 10)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        until system(File.join(PG_BIN, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", port.to_s)
          raise Unavailable, "PostgreSQL on port #{port} did not accept sessions" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          sleep 0.05
        end
      end

      def stop(pid, signal = :TERM)
        Process.kill(signal, pid)
        Process.wait(pid)
        true
      rescue Errno::ESRCH, Errno::ECHILD
        true
      end
    end
  end
end
