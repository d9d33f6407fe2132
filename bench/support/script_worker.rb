# frozen_string_literal: true

require "json"
require "rbconfig"
require "tmpdir"

module Bench
  # A Ruby process running a bench's WORKER script (`ruby -e SCRIPT ARGS...`), so each library under test
  # (this tree's, an older checkout's, a peer's) loads in a process of its own. The script prints "ready"
  # once loaded, then answers each line of space-separated arguments with one line of JSON.
  # The lib/ of `commit` exported from this checkout's git into a temporary directory (kept for later
  # runs), or nil when git or the commit is not there: the older code a bench compares with.
  def self.commit_lib(commit)
    dir = File.join(Dir.tmpdir, "herald-lib-#{commit}")
    return File.join(dir, "lib") if File.directory?(File.join(dir, "lib"))
    Dir.mkdir(dir) unless File.directory?(dir)
    ok = system("git -C #{File.expand_path("../..", __dir__)} archive #{commit} lib | tar -x -C #{dir}", err: File::NULL)
    File.join(dir, "lib") if ok && File.directory?(File.join(dir, "lib"))
  end

  class ScriptWorker
    # `prefix`: a command the worker runs under (e.g. valgrind and its options).
    def self.spawn(script, *args, prefix: [])
      io = IO.popen([*prefix, RbConfig.ruby, "-e", script, *args], "r+")
      raise "worker for #{args.first} did not start" unless io.gets == "ready\n"
      new(io)
    end

    attr_reader :io # the benches close it when done

    def initialize(io) = @io = io

    def run(*args)
      @io.puts args.join(" ")
      JSON.parse(@io.gets)
    end
  end
end
