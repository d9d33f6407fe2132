# frozen_string_literal: true

require_relative "cable_helper"
require "open3"
require "json"

# A broadcast from one process reaches the subscribers in two other processes, each exactly once, in
# order, on every store. The `async` adapter (in-process only) fails the same check: the check can fail.
class CableCrossProcessTest < Minitest::Test
  include Herald::CableTestSupport

  COUNT = 50
  ROOT = File.expand_path("../..", __dir__)
  BOOT = <<~RUBY
    require "json"
    require "logger"
    require "timeout"
    require "concurrent"
    require "active_support"
    require "active_support/core_ext/string/inflections"
    require "active_support/core_ext/hash/indifferent_access"
    require "action_cable"
    server = ActionCable::Server::Base.new
    server.config.cable = JSON.parse(ENV.fetch("CABLE")).with_indifferent_access
    server.config.logger = Logger.new(IO::NULL)
    BROADCASTING = ENV.fetch("BROADCASTING")
  RUBY
  SUBSCRIBER = <<~RUBY
    #{BOOT}
    got = Queue.new
    server.pubsub.subscribe(BROADCASTING, ->(payload) { got << payload }, -> { puts "ready"; $stdout.flush })
    received = []
    begin
      Timeout.timeout(Float(ENV.fetch("WAIT"))) { received << JSON.parse(got.pop) until received.last == {"done" => true} }
    rescue Timeout::Error
      nil # async: nothing comes
    end
    puts JSON.generate(received)
    server.pubsub.shutdown
  RUBY
  PUBLISHER = <<~RUBY
    #{BOOT}
    Integer(ENV.fetch("COUNT")).times { |i| server.broadcast(BROADCASTING, {"n" => i, "text" => "é 🎉 \#{i}"}) }
    server.broadcast(BROADCASTING, {"done" => true})
    server.pubsub.shutdown
  RUBY

  def teardown = shut_down_adapters

  STORES.each do |kind|
    define_method(:"test_two_other_processes_receive_each_broadcast_once_on_#{kind}") do
      assert_exactly_once exchange({adapter: "herald", store: store_setting(kind)}, wait: 30)
    end
  end

  def test_the_async_adapter_fails_the_same_check
    received = exchange({adapter: "async"}, wait: 3)
    error = assert_raises(Minitest::Assertion) { assert_exactly_once(received) }
    assert_match(/subscriber 1/, error.message)
    assert_equal [[], []], received, "async delivers nothing across processes"
  end

  private

  def expected = Array.new(COUNT) { |i| {"n" => i, "text" => "é 🎉 #{i}"} } + [{"done" => true}]

  def assert_exactly_once(received)
    received.each_with_index do |got, i|
      assert_equal expected, got, "subscriber #{i + 1}: every broadcast once, in order"
    end
  end

  # Two subscriber processes (each waits for its success callback), then a publisher process; returns
  # what each subscriber received.
  def exchange(cable, wait:)
    env = {"CABLE" => JSON.generate(cable), "BROADCASTING" => "room ✓ #{SecureRandom.hex(4)}", "WAIT" => wait.to_s, "COUNT" => COUNT.to_s}
    subscribers = Array.new(2) { Open3.popen2(env, RbConfig.ruby, "-I#{ROOT}/lib", "-e", SUBSCRIBER) }
    subscribers.each do |_, out, _|
      assert_equal "ready\n", Timeout.timeout(30) { out.gets }, "a subscriber did not confirm its subscription"
    end
    _, status = Open3.capture2(env, RbConfig.ruby, "-I#{ROOT}/lib", "-e", PUBLISHER)
    assert status.success?, "the publisher failed"
    subscribers.map do |stdin, out, thread|
      stdin.close
      line = Timeout.timeout(wait + 30) { out.read }
      assert thread.value.success?, "a subscriber failed"
      JSON.parse(line.lines.last)
    end
  end
end
