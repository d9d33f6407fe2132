# frozen_string_literal: true

$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "herald"
require "minitest/autorun"
require "tmpdir"
require "timeout"

module Herald
  module TestHelpers
    # Polls until the block is truthy; fails after `timeout` seconds. For asynchronous delivery only.
    def eventually(timeout: 5, message: "condition never became true")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        result = yield
        return result if result
        flunk message if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep 0.005
      end
    end

    # Repeats the block while a networked store says its server is away (a restart under way), up to `timeout`.
    def retrying(timeout: 10)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      begin
        yield
      rescue Herald::ConnectionError
        raise if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep 0.05
        retry
      end
    end

    def json_codec = Herald::Codec::Json
  end
end

Minitest::Test.include Herald::TestHelpers
