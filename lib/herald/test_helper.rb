# frozen_string_literal: true

require_relative "../herald"

module Herald
  # Tests that publish: a fresh memory store per test, assertions on what was published, and deferred
  # subscribers run on request. Deferred subscribers' workers do not start during a test (the process's
  # setting is restored after it): `perform_published_events` runs them inline, as ActiveJob's
  # perform_enqueued_jobs does for jobs.
  #
  #   require "herald/test_helper"
  #   class ActiveSupport::TestCase                      # or any Minitest::Test
  #     include Herald::TestHelper
  #   end
  #   RSpec.configure { |c| c.include Herald::TestHelper } # RSpec: the same module
  #
  #   assert_published "/chat", {"text" => "hi"} do ... end  # published inside the block
  #   assert_published "/chat", {"text" => "hi"}              # published during this test so far
  #   messages = capture_published { ... }                    # [Herald::Message], every channel
  #   expect { ... }.to herald_publish("/chat", {"text" => "hi"}) # RSpec: the same as a block matcher
  #   perform_published_events { Herald.publish_event(UserRegistered.new(user_id: 1)) } # deferred ones run now
  #   perform_published_events                                # ... on all published so far, not yet performed
  module TestHelper
    # RSpec example groups get a `before` hook (Minitest calls #before_setup). Checked by class: the module
    # itself defines before_setup, so every class that includes it has one.
    def self.included(base)
      return unless defined?(::RSpec::Core::ExampleGroup) && base.is_a?(Class) && base <= ::RSpec::Core::ExampleGroup
      base.before { herald_memory_store }
      base.after { herald_restore_autostart }
    end

    # Minitest runs this before every test (before `setup`).
    def before_setup
      herald_memory_store
      super
    end

    def after_teardown
      super
    ensure
      herald_restore_autostart
    end

    # Forgets the bus of the previous test (and its workers) and starts this one on an empty memory store.
    def herald_memory_store
      Herald.reset!
      Herald.configure { |c| c.store = :memory }
      @herald_test_start = 0
      @herald_performed = Set.new
      @herald_autostart = Events.autostart if @herald_autostart.nil?
      Events.autostart = false
    end

    # Runs the deferred subscribers inline on what the block published (after it returns; what they publish
    # is handled in turn) and returns the block's value; without a block, on everything published in this
    # test that no earlier call ran. A handler's exception propagates (no retries, no dead letters).
    def perform_published_events
      runner = Events::InlineRunner.new(Herald.bus.store)
      @herald_performed ||= Set.new
      return runner.run(0, done: @herald_performed) && nil unless block_given?
      before = Herald.bus.store.last_global_id
      result = yield
      runner.run(before, done: @herald_performed)
      result
    end

    # The messages published while the block ran, oldest first (all channels, every site).
    def capture_published
      before = Herald.bus.store.last_global_id
      yield
      Herald.global_backlog(before)
    end

    def assert_published(channel, data = nil, &block)
      messages = block ? capture_published(&block) : Herald.global_backlog(@herald_test_start || 0)
      on_channel = messages.select { |m| m.channel == channel }
      found = data.nil? ? on_channel.any? : on_channel.any? { |m| m.data == data }
      herald_assert found, "Expected a message on #{channel}#{" with #{data.inspect}" unless data.nil?}; " \
        "published: #{messages.map { |m| [m.channel, m.data] }.inspect}"
      on_channel
    end

    def refute_published(channel, &block)
      messages = block ? capture_published(&block) : Herald.global_backlog(@herald_test_start || 0)
      on_channel = messages.select { |m| m.channel == channel }
      herald_assert on_channel.empty?, "Expected nothing on #{channel}, got #{on_channel.map(&:data).inspect}"
    end

    # RSpec block matcher: `expect { ... }.to herald_publish(channel, data = nil)` (and `not_to`).
    def herald_publish(channel, data = nil) = PublishMatcher.new(self, channel, data)

    # The matcher protocol RSpec uses (matches?, failure messages, supports_block_expectations?), so this
    # file needs no RSpec at load.
    class PublishMatcher
      def initialize(helper, channel, data)
        @helper = helper
        @channel = channel
        @data = data
        @messages = []
      end

      def supports_block_expectations? = true

      def matches?(block)
        raise InvalidArgumentError, "herald_publish needs a block: expect { ... }.to herald_publish(#{@channel.inspect})" unless block.is_a?(Proc)
        @messages = @helper.capture_published(&block)
        @messages.any? { |m| m.channel == @channel && (@data.nil? || m.data == @data) }
      end

      def does_not_match?(block) = !matches?(block)

      def description = "publish #{"#{@data.inspect} " unless @data.nil?}on #{@channel}"

      def failure_message = "expected the block to #{description}; published: #{published}"

      def failure_message_when_negated = "expected the block not to #{description}; published: #{published}"

      private

      def published = @messages.map { |m| [m.channel, m.data] }.inspect
    end

    private

    def herald_restore_autostart
      Events.autostart = @herald_autostart unless @herald_autostart.nil?
      @herald_autostart = nil
    end

    # Minitest's assert, or RSpec's expectation failure, whichever framework runs the test.
    def herald_assert(condition, message)
      return assert(condition, message) if respond_to?(:assert)
      raise(defined?(RSpec::Expectations) ? RSpec::Expectations::ExpectationNotMetError : RuntimeError, message) unless condition
    end
  end
end
