# frozen_string_literal: true

require_relative "../herald"

module Herald
  # Tests that publish: a fresh memory store per test, and assertions on what was published.
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
  module TestHelper
    # RSpec example groups get a `before` hook (Minitest calls #before_setup). Checked by class: the module
    # itself defines before_setup, so every class that includes it has one.
    def self.included(base)
      return unless defined?(::RSpec::Core::ExampleGroup) && base.is_a?(Class) && base <= ::RSpec::Core::ExampleGroup
      base.before { herald_memory_store }
    end

    # Minitest runs this before every test (before `setup`).
    def before_setup
      herald_memory_store
      super
    end

    # Forgets the bus of the previous test (and its workers) and starts this one on an empty memory store.
    def herald_memory_store
      Herald.reset!
      Herald.configure { |c| c.store = :memory }
      @herald_test_start = 0
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

    # Minitest's assert, or RSpec's expectation failure, whichever framework runs the test.
    def herald_assert(condition, message)
      return assert(condition, message) if respond_to?(:assert)
      raise(defined?(RSpec::Expectations) ? RSpec::Expectations::ExpectationNotMetError : RuntimeError, message) unless condition
    end
  end
end
