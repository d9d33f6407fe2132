# frozen_string_literal: true

require "rbconfig"
require "tmpdir"
require_relative "../../test/support/spawned_server"

module Bench
  HTTP_ROOT = File.expand_path("../..", __dir__)
  THREADS = 5 # Puma threads, the same for every server (Herald::Server::DEFAULT_THREADS)
  # BENCH_HTTP_IMPLS=message_bus runs one side only (when working on the harness).
  # "herald" is the middleware on Puma (how an app embeds Herald); "herald-front" is `herald server`'s own
  # front end (Herald::Server::Front: polls answered on its event loop, Puma's C parser).
  IMPLS = {"message_bus 4.5.1 middleware" => "message_bus", "Herald middleware" => "herald"}
    .select { |_, impl| ENV.fetch("BENCH_HTTP_IMPLS", "message_bus,herald").split(",").include?(impl) }.freeze
  FRONT_IMPLS = (ENV.fetch("BENCH_HTTP_IMPLS", "message_bus,herald,herald-front").split(",").include?("herald-front") ?
    {"herald server (own event loop, Puma's parser)" => ["herald", ["--front", "herald"]],
     "herald server, reply cache off" => ["herald", ["--front", "herald", "--no-reply-cache"]]} : {}).freeze

  # Runs the block with a server in a child process: test/support/http_server.rb, the same Puma settings
  # (Herald::Server.build_puma) and demo app in front of message_bus's middleware (memory backend) or
  # Herald's (the embedded log in a temporary directory). Both lift the 1,000-client cap.
  # args: more options for http_server.rb (--trace, --workers N). root: the tree whose test/support/http_server.rb
  # (and so lib/) runs: another checkout's, for an A/B row in the same run (BENCH_OLD_ROOT).
  def self.with_http_server(impl, args = [], root = HTTP_ROOT)
    Dir.mktmpdir("herald-http-bench") do |dir|
      command = [RbConfig.ruby, File.join(root, "test/support/http_server.rb"), "--impl", impl,
        "--dir", dir, "--threads", THREADS.to_s, "--max-clients", "20000", *args]
      server = Herald::SpawnedServer.new(command, dir: dir)
      begin
        yield server
      ensure
        server.stop
      end
    end
  end

  # Runs the block with every server of impls ({name => impl, or [impl, args]}) up at once: {name => server}.
  def self.with_http_servers(impls, started = {}, &block)
    return yield(started) if impls.empty?
    (name, impl), *rest = impls.to_a
    with_http_server(*impl) { |server| with_http_servers(rest, started.merge(name => server), &block) }
  end

  # CPU seconds (user + system) the process has used so far, from /proc/PID/stat (clock ticks of 1/100 s).
  def self.cpu_seconds(pid)
    fields = File.read("/proc/#{pid}/stat").split(") ", 2).last.split
    (fields[11].to_i + fields[12].to_i) / 100.0
  end

  def self.rss_kb(pid) = File.read("/proc/#{pid}/status")[/VmRSS:\s+(\d+)/, 1].to_i

  def self.percentile(sorted, fraction) = sorted[((sorted.size - 1) * fraction).round]

  def self.store_note
    "Herald uses its default store, the embedded log (fsync :interval); message_bus uses its memory backend. " \
      "Load average #{File.read("/proc/loadavg").split.first(3).join(" ")} at the start (2 cores shared with other work)."
  end
end
