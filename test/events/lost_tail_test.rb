# frozen_string_literal: true

require_relative "events_helper"

# A deferred subscriber handled events and saved its cursor; then the end of the log was lost (power loss
# with fsync :interval: the cursor file was fsynced, the last records were not). The events published
# after the restart get ids above the lost ones, so the subscriber handles every one of them.
class EventsLostTailTest < Minitest::Test
  include Herald::EventsTestSupport

  def test_a_deferred_subscriber_whose_cursor_is_past_a_lost_tail_handles_the_new_events
    dir = File.join(@tmp, "log")
    r, w = IO.pipe
    pid = fork_child do
      r.close
      store = use_store(log_store(dir, fsync: :interval))
      handled = Queue.new
      define_subscriber("Mailer", Numbered, deferred: true) { |e, m| handled << [e.n, m.global_id] }
      20.times { |i| Herald.publish_event(Numbered.new(i + 1)) }
      last = Array.new(20) { handled.pop }.last.last
      eventually { store.load_cursor("Mailer") == last }
      w.puts last
      w.close
      Process.kill(:KILL, Process.pid) # power loss: no close, no final save
    end
    w.close
    cursor = Integer(r.read)
    Process.wait(pid)
    segment = Dir[File.join(dir, "*.log")].max
    File.truncate(segment, offset_of_record(segment, 12)) # events 13..20 never reached the disk

    capture_io { use_store(log_store(dir, fsync: :interval)) }
    handled = Queue.new
    define_subscriber("Mailer", Numbered, deferred: true) { |e, m| handled << [e.n, m.global_id] }
    fresh = (101..105).map { |n| Herald.publish_event(Numbered.new(n)) }
    got = Array.new(5) { Timeout.timeout(5, Minitest::Assertion, "the subscriber (cursor #{cursor}) skipped new events") { handled.pop } }
    assert_equal (101..105).to_a, got.map(&:first)
    fresh.each { |id| assert_operator id, :>, cursor, "a new event's id is above every id handed out before" }
  end

  private

  def offset_of_record(segment, index)
    image = File.binread(segment)
    pos = 0
    index.times { pos += 8 + image.unpack1("L<", offset: pos) }
    pos
  end
end
