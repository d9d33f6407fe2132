# frozen_string_literal: true

require_relative "../test_helper"
require_relative "contract"

class LogStoreTest < Minitest::Test
  include StoreContract

  def setup
    @dirs = []
    super
  end

  def teardown
    super
    @dirs.each { |d| FileUtils.rm_rf(d) }
  end

  def build_store(**options)
    dir = Dir.mktmpdir("herald-log")
    @dirs << dir
    Herald::Store::Log.new(dir: dir, fsync: :never, **options)
  end

  # Process.pid is a getpid(2) syscall: a publish, last_ids or backlog takes the pid ForkTracker cached
  # (refreshed on every fork) instead of asking the kernel each time.
  def test_reads_and_appends_do_not_ask_the_kernel_for_the_pid
    store = build_store
    store.append("/a", "1", codec: Herald::Codec::Json)
    Process.stub(:pid, -> { flunk "Process.pid called" }) do
      store.append("/a", "2", codec: Herald::Codec::Json)
      assert_equal({"/a" => 2}, store.last_ids(["/a"]))
      assert_equal 2, store.backlog("/a", 0).size
      assert_equal 2, store.last_global_id
    end
  end

  # An append wakes waiters only when some wait (Log#append_locked counts them): every waiter, also after
  # others timed out or were woken, is woken at once, not at its timeout.
  def test_append_wakes_every_waiter_at_once
    store = build_store
    store.wait(0, timeout: 0.01) # timed out: no longer counted
    3.times do |round|
      last = store.last_global_id
      waiters = Array.new(round + 1) { Thread.new { store.wait(last, timeout: 10) } }
      sleep 0.05 until waiters.all? { |t| t.status == "sleep" }
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      store.append("/a", "é😀", codec: Herald::Codec::Json)
      assert_equal [last + 1] * (round + 1), waiters.map(&:value)
      assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 5, "woken by the append, not the timeout"
    end
    assert_equal 0, store.instance_variable_get(:@waiting)
  end

  # What append returns (Message::Built, built positionally) is the message readers get back.
  def test_append_returns_the_message_as_stored
    store = build_store
    at = Process.clock_gettime(Process::CLOCK_REALTIME) - 1.5
    sent = [store.append("/é😀", '{"a":"\u0000"}', codec: Herald::Codec::Json, user_ids: [1, "é"], group_ids: ["g"],
      client_ids: ["c"], site_id: "s", created_at: at),
      store.append("/b", MessagePack.pack("\xFF".b), codec: Herald::Codec::Msgpack)]
    assert sent.all?(Herald::Message)
    fields = ->(m) { [m.global_id, m.message_id, m.channel, m.payload.b, m.codec, m.user_ids, m.group_ids, m.client_ids, m.site_id, m.data] }
    assert_equal [1, 1, "/é😀", '{"a":"\u0000"}'.b, Herald::Codec::Json, [1, "é"], ["g"], ["c"], "s", {"a" => "\u0000"}], fields.call(sent[0])
    assert_equal at, sent[0].created_at
    assert_equal "\xFF".b, sent[1].data
    store.close
    again = Herald::Store::Log.new(dir: store.dir, fsync: :never)
    read = again.global_backlog(0)
    assert_equal sent.map(&fields), read.map(&fields)
    assert_equal sent, read
    again.close
  end

  # A channel's records are built from bytes it keeps (Log#constant_parts) until the codec or the retention
  # a publish names changes: each record on disk carries its own codec and retention (read back here with
  # Record), and reads back the same after reopen.
  def test_records_of_a_channel_keep_their_codec_and_retention
    store = build_store
    json = Herald::Codec::Json
    msgpack = Herald::Codec::Msgpack
    week = Herald::Store::DEFAULT_MAX_BACKLOG_AGE.to_f
    plan = [[json, {}, nil], [json, {max_backlog_size: 2}, [2, week]], [json, {}, [2, week]], [msgpack, {}, [2, week]],
      [msgpack, {max_backlog_age: 3600}, [2, 3600.0]], [msgpack, {}, [2, 3600.0]],
      [json, {max_backlog_size: 1000, max_backlog_age: week}, [1000, week]], [json, {}, nil], [json, {}, nil]]
    plan.each_with_index do |(codec, retention, _), i|
      store.append("/c", codec.encode({"i" => i, "t" => "é😀\0"}), codec: codec, **retention)
      store.append("/c", codec.encode(i), codec: codec, site_id: "s") # the general encoder, same channel name
    end
    files = Dir[File.join(store.dir, "*.log")]
    assert_equal 1, files.size
    buffer = File.binread(files.first)
    on_disk = []
    pos = 0
    while pos < buffer.bytesize
      length = Herald::Store::Log::Record.check(buffer, pos, buffer.bytesize)
      msg = Herald::Store::Log::Record.decode(buffer, pos, length)
      on_disk << [msg.codec, msg.data, Herald::Store::Log::Record.retention(buffer, pos)] unless msg.site_id
      pos += Herald::Store::Log::Record::FRAME_SIZE + length
    end
    assert_equal plan.each_with_index.map { |(codec, _, kept), i| [codec, {"i" => i, "t" => "é😀\0"}, kept] }, on_disk
    reads = [store, Herald::Store::Log.new(dir: store.dir, fsync: :never)].map do |s|
      [s.backlog("/c", 0).map { |m| [m.codec, m.data] }, s.backlog("/c", 0, site_id: "s").map(&:data)]
    end
    assert_equal on_disk.last(5).map { |c, d, _| [c, d] }, reads[0][0], "trimmed to 2 until the seventh publish"
    assert_equal (0...plan.size).to_a, reads[0][1]
    assert_equal reads[0], reads[1]
  end

  # An empty directory name would put the log's files into the current directory.
  def test_an_empty_directory_is_refused
    assert_raises(Herald::InvalidArgumentError) { Herald::Store::Log.new(dir: "") }
    old = ENV["HERALD_DIR"]
    ENV["HERALD_DIR"] = ""
    error = assert_raises(Herald::ConfigurationError) { Herald::Store::Log.default_dir }
    assert_includes error.message, "HERALD_DIR"
    ENV["HERALD_DIR"] = "some/dir"
    assert_equal "some/dir", Herald::Store::Log.default_dir
  ensure
    ENV["HERALD_DIR"] = old
  end

  # Found by the model test: records published with the default retention were re-read after a restart
  # with the channel's last size (from STATE), so a size raised later brought trimmed messages back.
  def test_a_raised_max_backlog_size_brings_nothing_back_after_reopen
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = Herald::Store::Log.new(dir: dir, max_backlog_size: 3, segment_bytes: 150) # ~3 records a segment
    append("/keep", "k", store: s) # keeps the first segment, with /grow's first records, on disk
    6.times { |i| append("/grow", i, store: s) }
    append("/grow", 6, store: s, max_backlog_size: 10)
    8.times { |i| append("/other", i, store: s, max_backlog_size: 1) } # emptied segments go: STATE is saved
    assert_equal [3, 4, 5, 6], s.backlog("/grow", 0).map(&:data)
    s.close
    assert_equal [3, 4, 5, 6], store_in(dir, max_backlog_size: 3).backlog("/grow", 0).map(&:data)
  end

  # Each message keeps the max_backlog_age it was published with, also when read back after a restart.
  def test_a_changed_max_backlog_age_survives_reopen
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = Herald::Store::Log.new(dir: dir)
    append("/up", "short", store: s, max_backlog_age: 1, created_at: Time.now.to_f - 2)
    append("/up", "long", store: s, max_backlog_age: 3600)
    append("/down", "kept", store: s, max_backlog_age: 3600, created_at: Time.now.to_f - 10)
    append("/down", "new", store: s, max_backlog_age: 5)
    s.close
    again = store_in(dir)
    assert_equal ["long"], again.backlog("/up", 0).map(&:data)
    assert_equal ["kept", "new"], again.backlog("/down", 0).map(&:data)
    assert_equal ["long", "kept", "new"], again.global_backlog(0).map(&:data)
  end

  def test_messages_survive_reopen_with_ids_that_keep_increasing
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = Herald::Store::Log.new(dir: dir)
    append("/a", "one", store: s, user_ids: [1], site_id: "x")
    append("/b", {"two" => 2}, store: s)
    epoch = s.epoch
    s.close
    again = store_in(dir)
    assert_equal epoch, again.epoch
    assert_equal [{"two" => 2}], again.backlog("/b", 0).map(&:data)
    msg = again.backlog("/a", 0, site_id: "x").first
    assert_equal ["one", [1], "x"], [msg.data, msg.user_ids, msg.site_id]
    assert_equal 3, append("/c", 3, store: again).global_id
    assert_equal 2, append("/b", 3, store: again).message_id
  end

  def test_concurrent_always_appends_share_fsyncs_and_all_survive_reopen
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = store_in(dir, fsync: :always)
    threads = 8.times.map { |t| Thread.new { 40.times.map { |i| append("/g#{t % 2}", [t, i], store: s) } } }
    returned = threads.flat_map(&:value)
    assert_equal (1..320).to_a, returned.map(&:global_id).sort
    s.close
    again = store_in(dir)
    assert_equal (1..160).to_a, again.backlog("/g0", 0).map(&:message_id)
    assert_equal returned.sort_by(&:global_id).map(&:data), again.global_backlog(0).map(&:data)
  end

  # The index's global list was compacted only when the global backlog was read: a process nobody reads it
  # in (a web worker that publishes, or serves channel backlogs, with no subscriber) kept every message it
  # ever appended or read from other processes.
  def test_messages_trimmed_from_every_backlog_are_not_kept_in_memory
    store = build_store(max_backlog_size: 10)
    GC.start
    before = ObjectSpace.each_object(Herald::Message).count
    5000.times { |i| append("/trimmed", "é#{i}🎉", store: store) }
    GC.start
    kept = ObjectSpace.each_object(Herald::Message).count - before
    assert_operator kept, :<, 1500, "messages kept alive after 5,000 appends to a backlog of 10"
    assert_equal (4991..5000).to_a, store.backlog("/trimmed", 0).map(&:message_id)
    assert_equal ["é4990🎉", "é4999🎉"], store.global_backlog(4990).map(&:data).values_at(0, -1)
  end

  def test_targets_longer_than_64_kib_round_trip
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = store_in(dir, fsync: :never)
    users = (100_000...130_000).to_a # 150 KB of MessagePack: past the 16-bit length in the record's word
    append("/big", "x", store: s, user_ids: users, client_ids: ["c"])
    append("/big", "y", store: s)
    s.close
    msgs = store_in(dir).backlog("/big", 0)
    assert_equal [users, ["c"], "x"], [msgs[0].user_ids, msgs[0].client_ids, msgs[0].data]
    assert_equal ["y", nil, true], [msgs[1].data, msgs[1].user_ids, msgs[1].public?]
  end

  def test_cursors_persist_and_a_lease_is_freed_when_its_process_dies
    dir = Dir.mktmpdir("herald-log").tap { |d| @dirs << d }
    s = store_in(dir)
    s.save_cursor("Mailer/jobs", 7)
    r, w = IO.pipe
    pid = fork do
      r.close
      w.puts(store_in(dir).lease("Mailer/jobs") ? "held" : "refused")
      sleep 10
    end
    w.close
    assert_equal "held", r.gets.strip
    assert_nil s.lease("Mailer/jobs"), "another process holds it"
    Process.kill(:KILL, pid)
    Process.wait(pid)
    lease = s.lease("Mailer/jobs")
    assert lease, "freed when its owner died"
    lease.release
    assert_equal 7, store_in(dir).load_cursor("Mailer/jobs")
  end

  def test_unknown_fsync_mode_is_an_argument_error
    assert_raises(Herald::InvalidArgumentError) { Herald::Store::Log.new(dir: Dir.mktmpdir, fsync: :sometimes) }
  end

  private

  def store_in(dir, **options) = Herald::Store::Log.new(dir: dir, **options).tap { |s| @stores << s }
end
