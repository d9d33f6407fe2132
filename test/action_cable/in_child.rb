# frozen_string_literal: true

require_relative "../test_helper"
require "open3"

module Herald
  # The ActionCable tests load ActionCable and ActiveSupport, which nothing else in the suite may run with
  # (test/rails/notifications_test.rb): their cases (*_cases.rb) run in a child Ruby, and this checks its
  # result and prints its counts per test class (per store).
  module CableInChild
    ROOT = File.expand_path("../..", __dir__)

    def run_cases(file, timeout: 600)
      out = err = status = nil
      # Minitest reports on stdout, Herald's warnings go to stderr: read apart, the per-test lines stay whole.
      Open3.popen3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-I", File.join(ROOT, "test"), file, "-v", *child_args, chdir: ROOT) do |_, o, e, thread|
        errors = Thread.new { e.read }
        out = Timeout.timeout(timeout, nil, "#{File.basename(file)} ran over #{timeout} s") { o.read }
        err = errors.value
        status = thread.value
      end
      summary = out[/^\d+ runs, .*$/]
      puts "\n#{File.basename(file)}: #{summary}", per_class(out) if ENV["VERBOSE"] || !status.success?
      assert status.success?, (out + err).lines.last(80).join
      assert_match(/ 0 failures, 0 errors/, summary.to_s, out)
      summary
    end

    # HERALD_CABLE_N=/pattern/ runs only the matching cases (this run's own -n names the wrapper tests).
    def child_args = ENV["HERALD_CABLE_N"] ? ["-n", ENV["HERALD_CABLE_N"]] : []

    def per_class(out)
      out.scan(/(\w+)#\w+ = [\d.]+ s = ([.SFE])/).group_by(&:first).map do |name, results|
        "  #{name}: #{results.count { |r| r[1] == "." }} passed, #{results.count { |r| r[1] == "S" }} skipped, #{results.count { |r| !".S".include?(r[1]) }} failed"
      end
    end
  end
end
