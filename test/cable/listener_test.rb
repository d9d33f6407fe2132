# frozen_string_literal: true

require_relative "../test_helper"
require "delegate"
require "herald/cable/listener"

# Herald::Cable::Listener without ActionCable: a Memory store, an executor that runs each task on its own
# thread (as a pool would), and faults injected between the store and the reader.
class CableListenerTest < Minitest::Test
  Executor = Object.new
  def Executor.post(&block) = Thread.new(&block)

  # A Memory store whose global_backlog can be held (the reader then finds many records at once) and made to
  # fail once right after a read that filled its batch.
  class FaultyStore < SimpleDelegator
    attr_accessor :open, :fail_after_full_batch
    attr_reader :failures

    def initialize(store)
      super
      @open = true
      @failures = 0
    end

    def global_backlog(last_id = 0, limit: nil)
      sleep 0.005 until @open
      if @fail_next
        @fail_next = false
        @failures += 1
        raise Herald::ConnectionError, "injected: the connection dropped between two batches"
      end
      batch = __getobj__.global_backlog(last_id, limit: limit)
      if @fail_after_full_batch && limit && batch.size == limit
        @fail_after_full_batch = false
        @fail_next = true
      end
      batch
    end
  end

  def setup
    @store = FaultyStore.new(Herald::Store::Memory.new(max_backlog_size: 10_000))
    @listener = Herald::Cable::Listener.new(store: @store, executor: Executor)
    @log = StringIO.new
    Herald.logger = Logger.new(@log)
  end

  def teardown
    @listener.stop
    Herald.logger = nil
  end

  def append(broadcasting, payload) = @store.append(Herald::Cable.channel(broadcasting), payload, codec: Herald::Codec::Raw)

  def subscribe(broadcasting)
    got = Queue.new
    confirmed = Queue.new
    @listener.add(Herald::Cable.channel(broadcasting), ->(payload) { got << payload }, -> { confirmed << true })
    Timeout.timeout(5) { confirmed.pop }
    got
  end

  # A read that fails after earlier batches were delivered: the reader goes on after the last delivered
  # batch, so nothing is delivered twice (it was, before the cursor moved per batch).
  def test_a_failed_read_between_batches_delivers_nothing_twice
    count = Herald::Cable::Listener::BATCH + 500
    got = subscribe("room")
    @store.open = false
    @store.fail_after_full_batch = true
    count.times { |i| append("room", "m#{i}") }
    @store.open = true
    received = Timeout.timeout(20) { Array.new(count) { got.pop } }
    sleep 0.3 # a duplicate would come now
    assert_equal 1, @store.failures, "the fault was injected"
    assert_empty got, "nothing delivered twice"
    assert_equal Array.new(count) { |i| "m#{i}" }, received, "each once, in order"
    assert_match(/reading broadcasts failed: Herald::ConnectionError: injected/, @log.string)
  end

  # What was broadcast before a subscription was confirmed is not delivered to it; what comes after is.
  def test_a_subscription_gets_what_comes_after_its_confirmation_only
    append("room", "before")
    other = subscribe("other")
    append("other", "x")
    assert_equal "x", Timeout.timeout(5) { other.pop }
    got = subscribe("room")
    append("room", "after")
    assert_equal "after", Timeout.timeout(5) { got.pop }
    sleep 0.2
    assert_empty got
  end
end
