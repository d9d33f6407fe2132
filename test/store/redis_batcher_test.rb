# frozen_string_literal: true

require_relative "../test_helper"
require "herald/store/redis"

# Herald::Store::Redis::Batcher on its own, with a block standing in for the script call (the Redis tests
# run it against the server): every caller gets its own result, concurrent callers share calls, errors
# reach every caller of the batch, and nothing is left waiting after a failure or a killed thread.
class RedisBatcherTest < Minitest::Test
  Batcher = Herald::Store::Redis::Batcher

  # A stand-in for the round trip: sleeps (as a socket wait does, without the GVL) and answers each
  # request with its text reversed.
  def batcher(delay: 0.0005, &check)
    @sizes = []
    Batcher.new do |requests|
      @sizes << requests.size
      check&.call(requests)
      sleep delay
      requests.map { |r| r.reverse }
    end
  end

  def test_concurrent_callers_share_calls_and_each_gets_its_own_result
    b = batcher
    results = Array.new(8) { |t| Thread.new { Array.new(50) { |i| ["#{t} #{i} é🎉\u0000", b.call("#{t} #{i} é🎉\u0000")] } } }.flat_map(&:value)
    results.each { |sent, got| assert_equal sent.reverse, got }
    assert_equal 400, @sizes.sum
    # Quiet: ~51 calls (8 a call); a loaded machine reached 102 once. One call each would be 400.
    assert_operator @sizes.size, :<, 200, "#{@sizes.size} calls for 400 concurrent requests: #{@sizes.tally}"
    assert_operator @sizes.max, :<=, Batcher::MAX
  end

  # After a shared batch the next leader waits (GATHER) for the others once; a thread left alone then
  # calls straight away again.
  def test_a_thread_left_alone_stops_gathering
    b = batcher(delay: 0)
    Array.new(4) { Thread.new { 20.times { |i| b.call(i.to_s) } } }.each(&:join)
    # Counted, not timed: on a loaded machine a call that never waited can still take over GATHER.
    alone = 0
    b.singleton_class.prepend(Module.new { define_method(:call_alone) { |request| (alone += 1) && super(request) } })
    20.times { b.call("x") }
    assert_operator alone, :>=, 17, "#{alone} of 20 calls went straight to Redis"
    assert_equal [1] * 19, @sizes.last(19)
  end

  def test_an_error_reaches_every_caller_of_the_batch_and_the_next_calls_work
    failing = true
    b = batcher { raise Herald::ConnectionError, "lost" if failing }
    errors = Array.new(6) { Thread.new { b.call("a") rescue $! } }.map(&:value) # standard:disable Style/RescueModifier
    assert errors.all? { |e| e.is_a?(Herald::ConnectionError) }, errors.inspect
    failing = false
    assert_equal %w[a b c d], Array.new(4) { |i| Thread.new { b.call(%w[a b c d][i]) } }.map(&:value)
  end

  # A leader killed mid-call (Thread#kill, Timeout) gives its batch an error; later callers are served.
  def test_a_killed_leader_leaves_nobody_waiting
    entered = Queue.new
    b = Batcher.new do |requests|
      entered << true
      sleep 10 if requests.include?("stuck")
      requests
    end
    stuck = Thread.new { b.call("stuck") }
    entered.pop
    waiting = Array.new(3) { |i| Thread.new { b.call("w#{i}") rescue $! } } # standard:disable Style/RescueModifier
    sleep 0.05
    stuck.kill
    stuck.join
    assert_equal %w[w0 w1 w2], waiting.map { |t| Timeout.timeout(5) { t.value } }
    assert_equal "after", Timeout.timeout(5) { b.call("after") }
  end

  # Interrupted while queued (Thread#kill, Timeout): the caller was told the publish did not happen, so
  # its request is not sent; the others are. (It was the queue's head: the call's end woke it to lead, it
  # was dead, and the publisher behind it waited forever.)
  def test_a_caller_interrupted_while_queued_is_not_sent_and_leaves_nobody_waiting
    entered = Queue.new
    sent = []
    b = Batcher.new do |requests|
      sent.concat(requests)
      entered << true
      sleep 0.2 if requests == ["slow"]
      requests
    end
    slow = Thread.new { b.call("slow") }
    entered.pop
    queued = Thread.new { b.call("interrupted ☃") }
    sleep 0.02
    other = Thread.new { b.call("kept") }
    sleep 0.03
    queued.kill
    queued.join
    assert_equal "slow", Timeout.timeout(5) { slow.value }
    assert_equal "kept", Timeout.timeout(5) { other.value }
    assert_equal %w[slow kept], sent
  end

  # A finished batch's publishers are woken one by one, each by the one before; one that does not come
  # back must not leave the rest asleep (every wait is timed: Batcher#patience).
  def test_every_caller_returns_when_nobody_publishes_again
    b = batcher(delay: 0.002)
    3.times do |round|
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      got = Array.new(4) { |t| Thread.new { b.call("#{round} #{t} ü") } }.map { |th| Timeout.timeout(5) { th.value } }
      assert_equal Array.new(4) { |t| "#{round} #{t} ü".reverse }, got
      assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 1, "round #{round}"
    end
    assert_equal "enola", Timeout.timeout(5) { b.call("alone") }
  end

  # Four publishers sharing a call that blocks until released; returns the batcher, their threads by
  # request and the thread making the call.
  def shared_call_in_flight
    entered = Queue.new
    release = Queue.new
    b = Batcher.new do |requests|
      entered << [requests, Thread.current]
      release.pop
      requests.map(&:upcase)
    end
    first = Thread.new { b.call("a") } # alone: the others queue behind it and share the next call
    entered.pop
    threads = %w[b c d e].to_h { |r| [r, Thread.new { b.call(r) rescue $! }] } # standard:disable Style/RescueModifier
    sleep 0.05
    release << true
    assert_equal "A", Timeout.timeout(5) { first.value }
    requests, leader = Timeout.timeout(5) { entered.pop }
    assert_equal %w[b c d e], requests.sort
    [b, threads, leader, release]
  end

  # Killed while its batch's call runs (not the one making it): the publishers after it in the chain are
  # still woken, with their results.
  def test_a_publisher_killed_mid_call_does_not_strand_the_rest
    _, threads, leader, release = shared_call_in_flight
    victim, thread = threads.find { |_, t| !t.equal?(leader) }
    thread.kill
    thread.join
    release << true
    threads.each { |r, t| assert_equal r.upcase, Timeout.timeout(5) { t.value } unless r == victim }
  end

  # Thread#kill runs no rescue clause, only ensure: the leader killed mid-call gives its batch a
  # Herald::ConnectionError (the call may or may not have run), not nil. (They got nil.)
  def test_the_thread_making_a_shared_call_killed_mid_call_gives_the_others_an_error
    b, threads, leader, release = shared_call_in_flight
    leader.kill
    leader.join
    threads.each_value do |t|
      next if t.equal?(leader)
      got = Timeout.timeout(5) { t.value }
      assert_kind_of Herald::ConnectionError, got
      assert_match(/may or may not have been stored/, got.message)
    end
    release << true
    assert_equal "AFTER", Timeout.timeout(5) { b.call("after") }
  end

  # Hand-offs are what a shared call costs under the GVL. The leader wakes the first publisher of its
  # batch and returns, and each woken publisher wakes the next: about 1.4 voluntary context switches a
  # call at 4 threads; waking them all at once and spinning until they queued again cost 2.2-3.4 (each
  # woken thread found the GVL taken and slept again). Best of 3 runs, so a load spike does not decide it.
  def test_a_shared_call_costs_few_thread_switches
    skip "needs /proc/thread-self (Linux)" unless File.exist?("/proc/thread-self/status")
    switches = -> { File.read("/proc/thread-self/status")[/^voluntary_ctxt_switches:\s+(\d+)/, 1].to_i }
    b = batcher(delay: 0.0003)
    best = Array.new(3) do
      threads = Array.new(4) do
        Thread.new do
          before = switches.call
          200.times { |i| b.call(i.to_s) }
          switches.call - before
        end
      end
      threads.sum(&:value) / 800.0
    end.min
    assert_operator best, :<, 1.9, "voluntary context switches per call"
    assert_operator @sizes.sum.fdiv(@sizes.size), :>, 2, "records per call"
  end
end
