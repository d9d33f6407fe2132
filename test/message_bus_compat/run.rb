# frozen_string_literal: true

# Runs message_bus 4.5.1's own spec files (message_bus_spec, rack/middleware_spec, client_spec), unedited, from the installed gem, against Herald's drop-in
# (`require "herald/message_bus"`) or against message_bus itself (showing the harness is faithful).
#
#   ruby test/message_bus_compat/run.rb [dropin|message_bus] [memory|log|redis|postgres]
#
# log (drop-in only): `backend: :log`, Herald's embedded log, in a fresh directory ($HERALD_DIR) per run.
# redis / postgres: the real servers of test/support/servers.rb (or REDIS_URL / DATABASE_URL), handed to the
# spec as message_bus's spec_helper reads them (REDISURL and redis-rb's REDIS_URL; libpq's PG* variables).
#
# Prints each spec's result and a closing count: passed / failed / not-applicable (each with its reason) /
# known-failing (not done yet, each with its reason). Exits 1 on any other failure.
require "rbconfig"
require "open3"
require "tmpdir"
require "uri"
require_relative "../support/servers"

module MessageBusCompat
  ROOT = File.expand_path("../..", __dir__)
  GEM = Gem::Specification.find_by_name("message_bus", "4.5.1").gem_dir
  SPECS = %w[spec/lib/message_bus_spec.rb spec/lib/message_bus/rack/middleware_spec.rb spec/lib/message_bus/client_spec.rb].freeze
  SHIMS = File.join(__dir__, "shims") # gems the spec_helper requires that only other spec files use
  DROPIN = File.join(__dir__, "dropin") # `require "message_bus"` -> herald/message_bus

  # Where Herald deliberately differs (README "Differences from message_bus"): the spec pins message_bus's side.
  NOT_APPLICABLE = {
    "MessageBus#test_0002_can subscribe from a point in time" =>
      "pins message_bus's replay-on-subscribe bug: subscribe(channel, 1) when nothing follows id 1 replays the " \
      "whole backlog from 0 on the next message; Herald delivers each message once (README: Replay on subscribe)",
    "MessageBus#test_0005_should recover from a backlog expiring" =>
      "calls backend_instance.expire_all_backlogs!, a message_bus backend internal; Herald's backlogs expire by " \
      "max_backlog_age only, and ids never go back after they do (README: Ids after a backlog expires)"
  }.freeze

  # Drop-in specs that fail because the work is not done yet (none at the moment): name => why.
  KNOWN_FAILING = {}.freeze

  # Specs that cannot run here, for message_bus itself either: name pattern => why.
  CANNOT_RUN = {
    /\AMessageBus::Rack::Middleware::(thin async|hijack)#/ =>
      "message_bus's FakeAsyncMiddleware simulates Thin (eventmachine) and a hijacked socket (http_parser.rb); " \
      "neither gem is installed here (the spec errors the same way against message_bus)"
  }.freeze

  TIMEOUT = 240 # seconds per spec file (each takes 2-20 s)
  RESULT = /^(?<name>.+?) = [\d.]+ s = (?<mark>[.FES])$/

  def self.run(target: "dropin", backend: "memory", out: $stdout)
    counts = Hash.new(0)
    unexpected = []
    SPECS.each do |spec|
      results(spec, target, backend).each do |name, mark|
        kind = classify(name, mark, target)
        counts[kind] += 1
        unexpected << "#{name} (#{mark})" if kind == :failed
        out.puts "#{kind.to_s.ljust(14)} #{name}#{reason(name, kind)}"
      end
    end
    out.puts "message_bus 4.5.1 specs against #{target} on #{backend}: #{counts[:passed]} passed, #{counts[:failed]} failed, " \
      "#{counts[:not_applicable]} not applicable, #{counts[:known_failing]} known failing, #{counts[:cannot_run]} cannot run here, " \
      "#{counts[:skipped]} skipped by the spec itself"
    out.puts "unexpected failures: #{unexpected.join(", ")}" if unexpected.any?
    [counts, unexpected]
  end

  def self.results(spec, target, backend)
    includes = (target == "dropin") ? ["-I", File.join(ROOT, "lib"), "-I", DROPIN] : []
    # -rsecurerandom: client_spec uses SecureRandom without requiring it; message_bus's rake task runs every
    # spec file in one process, where another file has loaded it (alone, on memory, it is a NameError).
    cmd = [RbConfig.ruby, *includes, "-I", SHIMS, "-rsecurerandom", File.join(GEM, spec), "-v"]
    # stdout only: Minitest 5's deprecation warnings on stderr would split its result lines.
    output, errors, status = Dir.mktmpdir("mb-compat") do |dir|
      env = {"MESSAGE_BUS_BACKEND" => backend, "HERALD_DIR" => File.join(dir, "log")}.merge(server_env(backend))
      capture(env, cmd)
    end
    found = output.each_line.filter_map { |l| (m = RESULT.match(l.chomp)) && [m[:name], m[:mark]] }
    raise "#{spec} did not run (exit #{status.exitstatus}):\n#{(output + errors)[-3000..] || output + errors}" if found.empty?
    found
  end

  # Open3.capture3 with a deadline: message_bus's own PostgreSQL run hung once in its middleware spec (one
  # run in several); a hung child is killed and its output so far reported, never waited on forever.
  def self.capture(env, cmd, timeout: TIMEOUT)
    Open3.popen3(env, *cmd, chdir: ROOT, pgroup: true) do |stdin, stdout, stderr, waiter|
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      unless waiter.join(timeout)
        Process.kill(:KILL, -waiter.pid)
        return [out.value, "#{err.value}\n#{cmd.last(2).first} killed after #{timeout} s", waiter.value]
      end
      [out.value, err.value, waiter.value]
    end
  end

  def self.server_env(backend)
    case backend
    when "redis"
      url = Herald::TestServers.redis_url
      {"REDISURL" => url, "REDIS_URL" => url}
    when "postgres"
      pg = URI(Herald::TestServers.postgres_url)
      {"PGHOST" => pg.host, "PGPORT" => pg.port.to_s, "PGUSER" => pg.user, "PGDATABASE" => pg.path.delete_prefix("/"), "DATABASE_URL" => pg.to_s}
    else {}
    end
  end

  def self.classify(name, mark, target)
    return :skipped if mark == "S"
    return :passed if mark == "."
    return :cannot_run if CANNOT_RUN.keys.any? { |pattern| pattern.match?(name) }
    return :failed unless target == "dropin"
    return :not_applicable if NOT_APPLICABLE.key?(name)
    KNOWN_FAILING.key?(name) ? :known_failing : :failed
  end

  def self.reason(name, kind)
    case kind
    when :not_applicable then "\n               reason: #{NOT_APPLICABLE[name]}"
    when :cannot_run then "\n               cannot run here: #{CANNOT_RUN.find { |pattern, _| pattern.match?(name) }.last}"
    when :known_failing then "\n               not done yet: #{KNOWN_FAILING[name]}"
    else ""
    end
  end
end

if $PROGRAM_NAME == __FILE__
  _counts, unexpected = MessageBusCompat.run(target: ARGV[0] || "dropin", backend: ARGV[1] || "memory")
  exit(unexpected.empty? ? 0 : 1)
end
