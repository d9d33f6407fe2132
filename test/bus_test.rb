# frozen_string_literal: true

require_relative "test_helper"
require "delegate"

class BusTest < Minitest::Test
  def setup
    @errors = Queue.new
    @bus = Herald::Bus.new(store: Herald::Store::Memory.new, on_error: ->(e, msg) { @errors << [e, msg] })
  end

  def teardown
    @bus.close
  end

  def drain(queue, count)
    eventually { queue.size >= count }
    Array.new(queue.size) { queue.pop }
  end

  def test_publish_returns_per_channel_ids_and_keeps_targets
    assert_equal 1, @bus.publish("/a", "x", user_ids: [1], group_ids: [2], client_ids: ["c"], site_id: "s")
    assert_equal 2, @bus.publish("/a", "y", site_id: "s")
    msg = @bus.backlog("/a", 0, site_id: "s").first
    assert_equal [[1], [2], ["c"], "s"], [msg.user_ids, msg.group_ids, msg.client_ids, msg.site_id]
    assert_equal({"/a" => 2}, @bus.last_ids("/a", site_id: "s"))
  end

  def test_data_round_trips_with_json_semantics
    @bus.publish("/a", {:sym => [1, 2.5, nil, true], "s" => "é"}) # standard:disable Style/HashSyntax
    assert_equal({"sym" => [1, 2.5, nil, true], "s" => "é"}, @bus.backlog("/a").first.data)
  end

  def test_msgpack_bus
    bus = Herald::Bus.new(store: Herald::Store::Memory.new, codec: :msgpack)
    bus.publish("/a", {"n" => 1})
    msg = bus.backlog("/a").first
    assert_equal Herald::Codec::Msgpack, msg.codec
    assert_equal({"n" => 1}, msg.data)
  ensure
    bus.close
  end

  def test_invalid_targets_are_refused_like_message_bus
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/a", 1, user_ids: []) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/a", 1, group_ids: []) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/a", 1, client_ids: []) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/global/a", 1, user_ids: [1]) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/global/a", 1, group_ids: [1]) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("/a$|$b", 1) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish("", 1) }
    assert_raises(Herald::InvalidMessageError) { @bus.publish(:a, 1) }
    assert_equal 0, @bus.last_id("/a")
  end

  def test_global_channels_ignore_site
    @bus.publish("/global/news", 1, site_id: "a")
    @bus.publish("/global/news", 2, site_id: "b")
    assert_equal 2, @bus.last_id("/global/news", site_id: "a")
    assert_equal [1, 2], @bus.backlog("/global/news", 0, site_id: "b").map(&:data)
  end

  # Found by the model test: an ASCII channel or site id in another encoding (Rack's env strings are
  # ASCII-8BIT, Integer#to_s and Symbol#to_s give US-ASCII) came back in that encoding from Memory and as
  # UTF-8 from the other stores.
  def test_ascii_names_in_other_encodings_come_back_as_utf8
    bus = @bus
    [["/rack".b, "example.com".b], ["/n".encode("US-ASCII"), 42], ["/s", :site]].each do |channel, site|
      published = bus.publish_message(channel, "x", site_id: site)
      read = bus.backlog(channel, 0, site_id: site).last
      [published, read].each do |msg|
        assert_equal [Encoding::UTF_8, Encoding::UTF_8], [msg.channel.encoding, msg.site_id.encoding], "#{channel.inspect} #{site.inspect}"
        assert_equal [channel, site.to_s], [msg.channel, msg.site_id]
      end
    end
  end

  def test_unknown_codec_is_an_argument_error
    error = assert_raises(Herald::InvalidArgumentError) { Herald::Bus.new(codec: :yaml) }
    assert_match(/Unknown codec :yaml/, error.message)
  end

  def test_subscribe_delivers_only_new_messages_in_order
    @bus.publish("/a", "old")
    seen = Queue.new
    @bus.subscribe("/a") { |m| seen << m.data }
    sleep 0.05
    @bus.publish("/b", "other")
    3.times { |i| @bus.publish("/a", i) }
    assert_equal [0, 1, 2], drain(seen, 3)
  end

  def test_subscribe_from_last_id_gets_backlog_then_live
    3.times { |i| @bus.publish("/a", i) }
    seen = Queue.new
    @bus.subscribe("/a", 1) { |m| seen << m.message_id }
    @bus.publish("/a", 3)
    assert_equal [2, 3, 4], drain(seen, 3)
  end

  def test_subscribe_to_all_channels_by_global_id
    seen = Queue.new
    @bus.subscribe { |m| seen << m.channel }
    sleep 0.05
    @bus.publish("/x", 1)
    @bus.publish("/y", 2)
    assert_equal ["/x", "/y"], drain(seen, 2)
  end

  def test_unsubscribe_stops_delivery
    seen = Queue.new
    sub = @bus.subscribe("/a") { |m| seen << m.data }
    @bus.publish("/a", 1)
    drain(seen, 1)
    sub.unsubscribe
    refute sub.active?
    @bus.publish("/a", 2)
    sleep 0.2
    assert_equal 0, seen.size
  end

  def test_a_failing_subscriber_is_reported_and_does_not_stop_others
    seen = Queue.new
    @bus.subscribe("/a") { |_m| raise "boom" }
    @bus.subscribe("/a") { |m| seen << m.data }
    @bus.publish("/a", 1)
    @bus.publish("/a", 2)
    assert_equal [1, 2], drain(seen, 2)
    error, msg = @errors.pop
    assert_equal "boom", error.message
    assert_equal "/a", msg.channel
  end

  def test_closed_bus_refuses_publish
    @bus.close
    assert_raises(Herald::ClosedError) { @bus.publish("/a", 1) }
  end

  def test_a_forked_child_gets_its_own_dispatcher
    @bus.subscribe("/a") { |_m| } # the parent's dispatcher thread exists now, and is not inherited
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      @bus.subscribe("/child") { |m| writer.puts(m.data) }
      @bus.publish("/child", "from the child")
      sleep 2
      exit!(1)
    end
    writer.close
    line = reader.wait_readable(5) && reader.gets
    Process.kill(:KILL, pid)
    Process.wait(pid)
    assert_equal "from the child\n", line
  end

  # A store that fails its first catch-up read (as a networked store does after its retries): fault
  # injection on the real Memory store, not a stand-in for it.
  class FlakyCatchUpStore < Herald::Store::Memory
    def backlog(...)
      @failed ? super : (@failed = true) && raise(Herald::ConnectionError, "connection lost")
    end
  end

  def test_a_failed_catch_up_is_retried_not_dropped
    errors = Queue.new
    bus = Herald::Bus.new(store: FlakyCatchUpStore.new, on_error: ->(e, _m) { errors << e })
    bus.publish("/c", "before")
    got = Queue.new
    bus.subscribe("/c", 0) { |m| got << m.data }
    bus.subscribe("/c", 0) { |m| got << "second #{m.data}" }
    assert_kind_of Herald::ConnectionError, Timeout.timeout(5) { errors.pop }
    bus.publish("/c", "after")
    seen = Array.new(4) { Timeout.timeout(5) { got.pop } }
    assert_equal ["after", "before", "second after", "second before"], seen.sort
  ensure
    bus&.close
  end

  # The dispatcher reads in batches (Bus::BATCH); after a read fails between batches (a lost connection) it
  # reads again from where its round began, and each subscription's own position keeps what it delivered
  # from being delivered again.
  def test_a_read_failing_between_batches_delivers_nothing_twice
    store = Class.new(SimpleDelegator) do
      attr_accessor :fail_after
      def global_backlog(last_id = 0, limit: nil)
        if fail_after && last_id >= fail_after
          self.fail_after = nil
          raise Herald::ConnectionError, "connection lost (injected)"
        end
        __getobj__.global_backlog(last_id, limit: limit)
      end
    end.new(Herald::Store::Memory.new)
    bus = Herald::Bus.new(store: store, on_error: ->(*) {})
    got = []
    first = Queue.new
    release = Queue.new
    bus.subscribe("/b") do |msg|
      if got.empty?
        first << true
        release.pop # the dispatcher waits inside its round while the rest are published
      end
      got << msg.message_id
    end
    sleep 0.3 # the subscription is live
    bus.publish("/b", 1, max_backlog_size: 10_000) # all of them retained
    first.pop
    total = 2 * Herald::Bus::BATCH + 500
    (total - 1).times { |i| bus.publish("/b", i + 2, max_backlog_size: 10_000) }
    store.fail_after = Herald::Bus::BATCH + 1 # the read after the first full batch fails once
    release << true
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    sleep 0.05 until got.size >= total || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    sleep 0.3 # a repeat would come now
    assert_nil store.fail_after, "the injected failure happened"
    assert_equal (1..total).to_a, got, "every message once, in order"
  ensure
    bus&.close
  end
end
