# frozen_string_literal: true

require_relative "../test_helper"

# Store::Pool on its own (the networked stores' tests drive it against real servers): connections are
# plain objects here, so the checkout paths can be counted exactly.
class PoolTest < Minitest::Test
  Conn = Struct.new(:id, :closed)

  def setup
    @made = []
    @closed = []
    @alive = ->(_) { true }
  end

  def pool(size: 2, timeout: 0.2, broken: ->(e, _) { e.is_a?(IOError) }, connect: nil)
    Herald::Store::Pool.new(size: size, timeout: timeout,
      connect: connect || -> { Conn.new(@made.size + 1).tap { |c| @made << c } },
      close: ->(c) { @closed << c }, abandon: ->(_) {}, broken: broken, alive: ->(c) { @alive.call(c) })
  end

  def test_an_idle_connection_is_reused
    p = pool
    ids = Array.new(5) { p.with(&:id) }
    assert_equal [1] * 5, ids
    assert_equal 1, @made.size
  end

  def test_a_thread_waits_for_a_free_connection_then_times_out_naming_the_size
    p = pool(size: 2, timeout: 0.3)
    held = Queue.new
    release = Queue.new
    holders = Array.new(2) do
      Thread.new do
        p.with do |c|
          held << c.id
          release.pop
        end
      end
    end
    2.times { held.pop }
    waiter = Thread.new { p.with(&:id) }
    sleep 0.05
    assert waiter.alive?, "a third checkout waits while both connections are out"
    release << true
    assert_includes [1, 2], waiter.value
    error = assert_raises(Herald::ConnectionError) { p.with { p.with { p.with(&:id) } } }
    assert_match(/no free connection in 0.3s.*now 2/, error.message)
    release << true
    holders.each(&:join)
    assert_equal 2, @made.size
  end

  def test_a_broken_connection_is_closed_and_its_slot_freed
    p = pool(size: 1)
    assert_raises(IOError) { p.with { raise IOError, "lost" } }
    assert_equal [1], @closed.map(&:id)
    assert_equal 2, p.with(&:id), "a new connection takes the freed slot"
    assert_raises(ArgumentError) { p.with { raise ArgumentError } }
    assert_equal 2, p.with(&:id), "other errors keep the connection"
  end

  def test_a_dead_idle_connection_is_replaced_at_checkout
    p = pool(size: 1)
    p.with(&:id)
    @alive = ->(c) { c.id != 1 }
    assert_equal 2, p.with(&:id)
    assert_equal [1], @closed.map(&:id)
  end

  def test_a_failed_connect_frees_its_slot
    attempts = 0
    p = pool(size: 1, connect: -> { ((attempts += 1) == 1) ? raise(IOError, "refused") : Conn.new(7) })
    assert_raises(IOError) { p.with(&:id) }
    assert_equal 7, p.with(&:id)
  end
end
