# frozen_string_literal: true

# The store contract, run unchanged against every store. A test class includes this module and defines
# `build_store(**options)` returning a fresh, empty store (and may define `reopen_store` for persistence).
module StoreContract
  def setup
    super
    @stores = []
    @store = store(max_backlog_size: 1000)
  end

  def teardown
    @stores.each { |s| s.close rescue nil } # standard:disable Style/RescueModifier
    super
  end

  def store(**options)
    build_store(**options).tap { |s| @stores << s }
  end

  def append(channel, data, store: @store, **options)
    store.append(channel, json_codec.encode(data), codec: json_codec, **options)
  end

  def test_empty_store
    assert_equal 0, @store.last_id("/a")
    assert_equal 0, @store.last_global_id
    assert_equal [], @store.backlog("/a", 0)
    assert_equal [], @store.global_backlog(0)
    assert_equal({"/a" => 0, "/b" => 0}, @store.last_ids(["/a", "/b"]))
    assert_kind_of String, @store.epoch
    assert_equal @store.epoch, @store.known_epoch, "the epoch without a round trip (named in every MessagePack reply)"
  end

  def test_append_assigns_global_and_channel_ids
    a1 = append("/a", "x")
    b1 = append("/b", {"k" => [1, 2]})
    a2 = append("/a", nil)
    assert_equal [1, 1, 2], [a1, b1, a2].map(&:message_id)
    assert_operator a1.global_id, :<, b1.global_id
    assert_operator b1.global_id, :<, a2.global_id
    assert_equal a2.global_id, @store.last_global_id
    assert_equal({"/a" => 2, "/b" => 1}, @store.last_ids(["/a", "/b"]))
    # Without the lock (Rack::ReplyCache asks on every poll): the same once appends have returned.
    assert_equal a2.global_id, @store.peek_last_global_id
  end

  # What readers decide by (never the store's class): local reads let an event loop read inline; a watch
  # calls back on every append, and a store without one says so with nil.
  def test_capabilities
    assert_includes [true, false], @store.local_reads?
    calls = 0
    watch = @store.watch { calls += 1 }
    if watch
      assert @store.local_reads?, "a store that calls back reads locally (the callback reads it inline)"
      append("/cap", "x")
      assert_operator calls, :>=, 1, "the watch is called after an append"
      watch.cancel
      append("/cap", "y")
      assert_equal calls, calls.tap { append("/cap", "z") }, "a cancelled watch is not called"
    end
  end

  def test_backlog_returns_messages_after_id_with_data_and_targets
    append("/a", "one")
    append("/a", {"two" => 2}, user_ids: [1, 2], group_ids: [3], client_ids: ["c1"])
    append("/a", 3)
    backlog = @store.backlog("/a", 1)
    assert_equal [2, 3], backlog.map(&:message_id)
    assert_equal [{"two" => 2}, 3], backlog.map(&:data)
    msg = backlog.first
    assert_equal "/a", msg.channel
    assert_equal [1, 2], msg.user_ids
    assert_equal [3], msg.group_ids
    assert_equal ["c1"], msg.client_ids
    assert_nil backlog.last.user_ids
    assert_kind_of Float, msg.created_at
  end

  def test_global_backlog_orders_by_global_id_and_honours_limit
    5.times { |i| append("/c#{i % 2}", i) }
    all = @store.global_backlog(0)
    assert_equal (0..4).to_a, all.map(&:data)
    assert_equal all.map(&:global_id).sort, all.map(&:global_id)
    after = @store.global_backlog(all[1].global_id, limit: 2)
    assert_equal [2, 3], after.map(&:data)
  end

  def test_msgpack_payloads_round_trip_with_their_codec
    codec = Herald::Codec::Msgpack
    @store.append("/m", codec.encode({"bin" => "\xFF\x00".b, "n" => 1}), codec: codec)
    msg = @store.backlog("/m", 0).first
    assert_equal codec, msg.codec
    assert_equal({"bin" => "\xFF\x00".b, "n" => 1}, msg.data)
  end

  def test_sites_count_ids_separately
    append("/chat", 1, site_id: "a")
    append("/chat", 2, site_id: "a")
    append("/chat", 3, site_id: "b")
    assert_equal 2, @store.last_id("/chat", site_id: "a")
    assert_equal 1, @store.last_id("/chat", site_id: "b")
    assert_equal 0, @store.last_id("/chat")
    assert_equal [3], @store.backlog("/chat", 0, site_id: "b").map(&:data)
    assert_equal "b", @store.backlog("/chat", 0, site_id: "b").first.site_id
  end

  def test_max_backlog_size_trims_per_channel_but_ids_keep_counting
    s = store(max_backlog_size: 3)
    5.times { |i| append("/a", i, store: s) }
    append("/b", "b", store: s)
    assert_equal [3, 4, 5], s.backlog("/a", 0).map(&:message_id)
    assert_equal 5, s.last_id("/a")
    assert_equal ["b"], s.backlog("/b", 0).map(&:data)
    refute_includes s.global_backlog(0).map(&:data), 0
  end

  def test_per_publish_max_backlog_size_sets_the_channel_retention
    6.times { |i| append("/a", i, max_backlog_size: 2) }
    assert_equal [4, 5], @store.backlog("/a", 0).map(&:data)
  end

  def test_max_backlog_age_expires_old_messages
    s = store(max_backlog_age: 1)
    append("/old", "x", store: s, created_at: Time.now.to_f - 5)
    append("/new", "y", store: s)
    assert_equal [], s.backlog("/old", 0)
    assert_equal 1, s.last_id("/old")
    assert_equal ["y"], s.backlog("/new", 0).map(&:data)
  end

  # Found by the model test (test/store/model_test.rb): Memory returned messages that had left their
  # channel's backlog when an older one was still retained, and Redis/PostgreSQL applied `limit` before
  # leaving out expired messages, so a page could come back short or empty with retained messages after it.
  def test_global_backlog_leaves_out_what_left_its_channel_even_between_retained_messages
    s = store(max_backlog_size: 2)
    first = append("/keep", "first", store: s)
    4.times { |i| append("/trim", i, store: s) }
    3.times { |i| append("/old", "old#{i}", store: s, created_at: Time.now.to_f - 10, max_backlog_age: 5) }
    append("/keep", "last", store: s)
    assert_equal ["first", 2, 3, "last"], s.global_backlog(0).map(&:data)
    assert_equal ["first", 2], s.global_backlog(0, limit: 2).map(&:data)
    assert_equal [2, 3, "last"], s.global_backlog(first.global_id, limit: 3).map(&:data)
  end

  # Found by the model test: Redis trims a channel in batches (once it is size/16 over), so raising the
  # channel's max_backlog_size brought back messages the smaller size had already dropped.
  def test_raising_max_backlog_size_brings_nothing_back
    40.times { |i| append("/grow", i, max_backlog_size: 32) }
    append("/grow", 40, max_backlog_size: 100)
    assert_equal (8..40).to_a, @store.backlog("/grow", 0).map(&:data)
    refute_includes @store.global_backlog(0).map(&:data), 7
  end

  # Found by the model test: a publish's max_backlog_age is the channel's retention "from now on", and
  # each message keeps the age it was published with (as Redis and PostgreSQL store it). Memory applied a
  # changed age to the messages already stored, and the Log did too unless a read had dropped them first.
  def test_a_changed_max_backlog_age_applies_to_later_messages_only
    append("/up", "short", max_backlog_age: 1, created_at: Time.now.to_f - 2)
    assert_equal [], @store.backlog("/up", 0) # read before the age changes
    append("/up", "long", max_backlog_age: 3600)
    append("/up2", "short", max_backlog_age: 1, created_at: Time.now.to_f - 2)
    append("/up2", "long", max_backlog_age: 3600) # no read before the age changes
    append("/down", "kept", max_backlog_age: 3600, created_at: Time.now.to_f - 10)
    append("/down", "new", max_backlog_age: 5)
    append("/down", "newer")
    assert_equal ["long"], @store.backlog("/up", 0).map(&:data)
    assert_equal ["long"], @store.backlog("/up2", 0).map(&:data)
    assert_equal ["kept", "new", "newer"], @store.backlog("/down", 0).map(&:data)
    assert_equal ["long", "long", "kept", "new", "newer"], @store.global_backlog(0).map(&:data)
  end

  # Found by the model test: the Redis/PostgreSQL backlog cache skipped the age filter when the first
  # message was live, so a later message with a shorter age was served after it expired.
  def test_a_message_with_a_shorter_age_than_the_one_before_expires_on_time
    @store.backlog("/mixed", 0)
    @store.wait(@store.last_global_id, timeout: 0.3) # networked stores: the listener is up, reads are cached
    append("/mixed", "long", max_backlog_age: 3600)
    append("/mixed", "short", max_backlog_age: 0.6)
    sleep 0.1 # the listener hears of both appends before the read below fills the cache
    assert_equal ["long", "short"], @store.backlog("/mixed", 0).map(&:data)
    sleep 0.6
    assert_equal ["long"], @store.backlog("/mixed", 0).map(&:data)
  end

  # Found by the model test: Redis and PostgreSQL named a backlog's messages with the reader's channel
  # String, so a read with an ASCII-8BIT name (from a Rack env) returned ASCII-8BIT channels.
  def test_backlog_channels_are_utf8_whatever_the_encoding_of_the_name_read
    append("/rack", "x")
    assert_equal [Encoding::UTF_8], @store.backlog("/rack".b, 0).map { |m| m.channel.encoding }
  end

  def test_invalid_retention_is_an_argument_error
    assert_raises(Herald::InvalidMessageError) { append("/a", 1, max_backlog_size: 0) }
    assert_raises(Herald::InvalidMessageError) { append("/a", 1, max_backlog_age: -1) }
  end

  def test_wait_returns_at_once_when_behind_and_blocks_until_append
    append("/a", 1)
    assert_equal 1, @store.wait(0, timeout: 5)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    assert_equal 1, @store.wait(1, timeout: 0.2)
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :>=, 0.15
    waiter = Thread.new { @store.wait(1, timeout: 5) }
    sleep 0.05
    append("/a", 2)
    assert_equal 2, waiter.value
  end

  def test_wait_raises_closed_error_once_closed_so_reader_loops_end
    s = store
    waiter = Thread.new { s.wait(0, timeout: 5) }
    waiter.report_on_exception = false # the ClosedError is the expected outcome, joined below
    sleep 0.05
    s.close
    assert_raises(Herald::ClosedError) { waiter.value }
    assert_raises(Herald::ClosedError) { s.wait(0, timeout: 1) }
  end

  def test_cursors_start_at_zero_and_persist_values
    assert_equal 0, @store.load_cursor("Sub")
    @store.save_cursor("Sub", 42)
    assert_equal 42, @store.load_cursor("Sub")
    assert_equal 0, @store.load_cursor("Other")
    # A new deferred subscriber tells "never saved" from a saved 0 (where it starts depends on it).
    assert_nil @store.load_cursor("Other", default: nil)
    @store.save_cursor("Zero", 0)
    assert_equal 0, @store.load_cursor("Zero", default: nil)
  end

  def test_lease_is_exclusive_until_released
    lease = @store.lease("Sub")
    assert lease
    assert_nil @store.lease("Sub")
    lease.release
    again = @store.lease("Sub")
    assert again
    again.release
  end

  # Operators look at who holds a lease (the dashboard): "host:pid", nil once released.
  def test_lease_holder_names_the_holding_process
    assert_nil @store.lease_holder("Sub ✓ <b>")
    lease = @store.lease("Sub ✓ <b>")
    assert_equal "#{Socket.gethostname}:#{Process.pid}", @store.lease_holder("Sub ✓ <b>")
    assert_nil @store.lease_holder("Other")
    lease.release
    assert_nil @store.lease_holder("Sub ✓ <b>")
  end

  def test_retention_of_a_channel_is_the_default_until_a_publish_sets_one
    s = store(max_backlog_size: 100, max_backlog_age: 3600)
    append("/r", 1, store: s, max_backlog_size: 5, max_backlog_age: 60)
    append("/r", 2, store: s)
    assert_equal [5, 60], s.retention("/r")
    assert_equal [100, 3600], s.retention("/never ✓")
    append("/r", 3, store: s, site_id: "s", max_backlog_size: 7)
    assert_equal [7, 3600], s.retention("/r", site_id: "s")
    assert_equal [5, 60], s.retention("/r")
  end

  # Pausing is kept in the store (every process's worker reads it), apart from the subscriber's cursor.
  def test_pause_and_resume_are_kept_apart_from_the_cursor
    refute @store.paused?("Sub")
    @store.save_cursor("Sub", 7)
    @store.pause("Sub")
    assert @store.paused?("Sub")
    refute @store.paused?("Other")
    assert_equal 7, @store.load_cursor("Sub")
    @store.resume("Sub")
    refute @store.paused?("Sub")
    assert_equal 0, @store.reset_mark("Sub")
    @store.mark_reset("Sub", 12)
    assert_equal 12, @store.reset_mark("Sub")
    assert_equal 7, @store.load_cursor("Sub")
  end

  def test_concurrent_appends_get_unique_contiguous_ids
    threads = 4.times.map { |t| Thread.new { 250.times { |i| append("/c", [t, i]) } } }
    threads.each(&:join)
    backlog = @store.backlog("/c", 0)
    assert_equal (1..1000).to_a, backlog.map(&:message_id)
    globals = backlog.map(&:global_id)
    assert_equal globals.sort, globals
    assert_equal 1000, globals.uniq.size
  end

  def test_bus_subscribe_from_last_id_while_publishing_has_no_gap_or_duplicate
    bus = Herald::Bus.new(store: @store)
    100.times { |i| bus.publish("/s", i) }
    seen = Queue.new
    publisher = Thread.new { 400.times { |i| bus.publish("/s", 100 + i) } }
    bus.subscribe("/s", 50) { |m| seen << m.message_id }
    publisher.join
    ids = eventually { (seen.size >= 450) && Array.new(seen.size) { seen.pop } }
    sleep 0.05
    assert_equal (51..500).to_a, ids + Array.new(seen.size) { seen.pop }
  end

  # The clock going backwards (NTP step, VM restore): a message is retained by its own age, whatever its
  # neighbours' timestamps; an older-looking message behind a fresh one is not served as live.
  def test_age_retention_is_per_message_when_the_clock_went_backwards
    s = store(max_backlog_age: 100)
    now = Time.now.to_f
    fresh = append("/c", "fresh", store: s, created_at: now - 10)
    append("/c", "stale, stamped after a clock step back", store: s, created_at: now - 1000)
    later = append("/c", "fresh again", store: s, created_at: now - 5)
    assert_equal [fresh.message_id, later.message_id], s.backlog("/c", 0).map(&:message_id)
    assert_equal [fresh.global_id, later.global_id], s.global_backlog(0).map(&:global_id)
    assert_equal 3, s.last_id("/c"), "ids are not affected by the clock"
  end
end
