# frozen_string_literal: true

require "json"
require "rbconfig"

module Bench
  # A Ruby process running a bench's WORKER script (`ruby -e SCRIPT ARGS...`), so each library under test
  # (this tree's, an older checkout's, a peer's) loads in a process of its own. The script prints "ready"
  # once loaded, then answers each line of space-separated arguments with one line of JSON.
  class ScriptWorker
    def self.spawn(script, *args)
      io = IO.popen([RbConfig.ruby, "-e", script, *args], "r+")
      raise "worker for #{args.first} did not start" unless io.gets == "ready\n"
      new(io)
    end

    def initialize(io) = @io = io

    def run(*args)
      @io.puts args.join(" ")
      JSON.parse(@io.gets)
    end
  end
end
