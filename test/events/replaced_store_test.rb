# frozen_string_literal: true

require_relative "events_helper"

# A deferred subscriber whose log directory is wiped and recreated under it (issue 23, defect 3): its lease
# and cursor were in the deleted directory. It must let them go, take the new directory's, and run the
# events published there; before, it never saw them (and kept a lease on a deleted file).
class ReplacedStoreTest < Minitest::Test
  include Herald::EventsTestSupport

  CHANNEL = "/events/herald/events_test_support/numbered"

  def test_a_deferred_subscriber_runs_the_events_of_a_directory_recreated_under_it
    dir = File.join(@tmp, "log")
    store = Herald::Store::Log.new(dir: dir, fsync: :never)
    seen = Queue.new
    subscriber = define_subscriber("replaced", Numbered, deferred: true) { |e, _m| seen << e.n }
    pool = Herald::Events::WorkerPool.new(store: store, subscribers: [subscriber], threads: 1)
    (1..3).each { |n| append(store, n) }
    assert_equal [1, 2, 3], Array.new(3) { pop(seen) }

    pid = fork_child do
      FileUtils.rm_rf(dir)
      other = Herald::Store::Log.new(dir: dir, fsync: :never)
      (101..103).each { |n| append(other, n) }
      other.close
    end
    Process.wait(pid)
    assert $?.success?

    assert_equal [101, 102, 103], Array.new(3) { pop(seen) }, "the new directory's events, in order"
    eventually(timeout: BOUND) { store.load_cursor("replaced") == 3 }
    pool.shutdown(timeout: 2)
    assert seen.empty?, "nothing else ran: #{seen.size} more"
    assert_equal 3, Herald::Store::Log.new(dir: dir).tap(&:close).load_cursor("replaced"), "the cursor is saved in the new directory"
  ensure
    store&.close
  end

  private

  def append(store, n) = store.append(CHANNEL, Herald::Codec::Event.encode(Numbered.new(n)), codec: Herald::Codec::Event)

  BOUND = 10 # seconds; the reset is seen within about half a second, the rest is a loaded machine's slack

  def pop(queue)
    deadline = monotonic + BOUND
    sleep 0.01 while queue.empty? && monotonic < deadline
    queue.empty? ? flunk("nothing within #{BOUND} s") : queue.pop
  end
end
