# frozen_string_literal: true

require_relative "../../test_helper"
require_relative "../../support/real_data"

# A log directory replaced under a running store (issue 23, defect 3): an operator wiping a dev store or
# restoring a backup while a server runs. The running store must notice, open the new directory, change
# its epoch and tell its readers; before, it served the deleted messages until restarted, never saw the
# new ones, and its own publishes went into deleted files.
class LogReplacedDirectoryTest < Minitest::Test
  BOUND = 3.0 # seconds for a process holding the store open to see the new directory (it looks every 0.25 s)
  NEW_DATA = [RealData::TEXTS[0], RealData::TEXTS[3], RealData::TEXTS[6], "😀 plain"].freeze

  def setup
    @tmp = Dir.mktmpdir("herald-replaced")
    @dir = File.join(@tmp, "log")
    @resets = Queue.new
  end

  def teardown
    @buses&.each(&:close)
    FileUtils.rm_rf(@tmp)
  end

  # One process holds the store open with a subscriber and a watcher; another wipes and recreates the
  # directory and publishes. The first sees the new epoch, the new messages (backlog, global backlog,
  # subscriber), on_reset, within BOUND; its next publish lands in the new directory.
  def test_a_store_held_open_sees_the_directory_wiped_and_recreated_by_another_process
    bus = open_bus
    store = bus.store
    5.times { |i| bus.publish("/chat", {"old" => i}) }
    old_epoch = store.epoch
    got = Queue.new
    bus.subscribe("/chat") { |msg| got << msg.data }
    watched = Queue.new
    watch = store.watch { watched << true }
    sleep 0.2 # the subscription is live

    started = monotonic
    in_child { replace_and_publish(NEW_DATA) }
    new_epoch = wait_for { (e = store.known_epoch) != old_epoch && e }
    seen_at = monotonic - started
    delivered = Array.new(NEW_DATA.size) { pop(got) }
    puts "\n  replaced directory noticed after #{(seen_at * 1000).round} ms (bound #{BOUND} s)"

    assert_equal NEW_DATA.map { |t| {"text" => t} }, delivered, "the subscriber got the new directory's messages"
    assert_equal NEW_DATA.map { |t| {"text" => t} }, bus.backlog("/chat").map(&:data)
    assert_equal [1, 2, 3, 4], store.global_backlog(0).map(&:global_id)
    assert_equal [old_epoch, new_epoch], pop(@resets), "on_reset told"
    refute_nil pop(watched), "watchers woken"
    assert_equal 1, store.resets

    bus.publish("/chat", {"text" => "after"})
    assert_equal({"text" => "after"}, pop(got))
    fresh = Herald::Store::Log.new(dir: @dir)
    assert_equal new_epoch, fresh.epoch
    assert_equal [1, 2, 3, 4, 5], fresh.global_backlog(0).map(&:global_id), "its publish is in the new directory"
    fresh.close
    watch.cancel
  end

  # The publishing process notices before it writes: a publish right after the wipe (before its listener
  # looked) must not go into the deleted files.
  def test_a_publish_right_after_the_wipe_lands_in_the_new_directory
    bus = open_bus
    3.times { |i| bus.publish("/p", i) }
    old_epoch = bus.store.epoch
    sleep 0.05 # the lease is dropped after 20 ms unused: the next publish takes it again
    in_child { replace_and_publish(["from elsewhere"]) }
    msg = bus.publish_message("/p", "mine")
    assert_equal [2, 1], [msg.global_id, msg.message_id], "numbered after the new directory's one record"
    refute_equal old_epoch, bus.store.epoch
    fresh = Herald::Store::Log.new(dir: @dir)
    assert_equal [{"text" => "from elsewhere"}, "mine"], fresh.global_backlog(0).map(&:data)
    fresh.close
  end

  # Wiped and nobody else reopened it: the next publish recreates it (a new epoch), never a deleted file.
  def test_a_publish_into_a_wiped_directory_recreates_it
    bus = open_bus
    bus.publish("/w", 1)
    old_epoch = bus.store.epoch
    sleep 0.05
    FileUtils.rm_rf(@dir)
    bus.publish("/w", 2)
    refute_equal old_epoch, bus.store.epoch
    fresh = Herald::Store::Log.new(dir: @dir)
    assert_equal [2], fresh.backlog("/w").map(&:data)
    fresh.close
  end

  # An older backup of the same log put back: the same epoch, messages gone. That is a reset too (a new
  # epoch, written to META so every process agrees): what readers were shown is not there any more.
  def test_an_older_backup_of_the_same_log_put_back_is_a_reset
    bus = open_bus
    store = bus.store
    got = Queue.new
    bus.subscribe("/b") { |msg| got << msg.data }
    3.times { |i| bus.publish("/b", i) }
    backup = File.join(@tmp, "backup")
    FileUtils.cp_r(@dir, backup)
    3.times { |i| bus.publish("/b", 3 + i) }
    assert_equal [0, 1, 2, 3, 4, 5], Array.new(6) { pop(got) }
    old_epoch = store.epoch
    in_child do
      FileUtils.rm_rf(@dir)
      FileUtils.cp_r(backup, @dir)
    end
    new_epoch = wait_for { (e = store.known_epoch) != old_epoch && e }
    assert_equal [old_epoch, new_epoch], pop(@resets)
    assert_equal [0, 1, 2], bus.backlog("/b").map(&:data)
    assert_equal [0, 1, 2], Array.new(3) { pop(got) }, "the subscriber is given the restored messages again"
    bus.publish("/b", "next")
    assert_equal "next", pop(got)
    other = Herald::Store::Log.new(dir: @dir)
    assert_equal new_epoch, other.epoch, "the new epoch is the directory's"
    other.close
  end

  # Three threads keep publishing (fsync :always and :interval) while another process replaces the
  # directory five times: no publish raises (a group commit's leader in fdatasync on a file the reset closed
  # raised IOError; a wakeup being replaced, NoMethodError), the store ends on the directory's epoch with its
  # records in order, and a subscription delivers the last directory's messages, in order, after the others.
  def test_publishers_keep_publishing_through_replacements
    %i[always interval].each do |fsync|
      FileUtils.rm_rf(@dir)
      store = Herald::Store::Log.new(dir: @dir, fsync: fsync)
      bus = Herald::Bus.new(store: store).tap { |b| (@buses ||= []) << b }
      got = Queue.new
      bus.subscribe("/t") { |msg| got << msg.data }
      errors = Queue.new
      stop = false
      publishers = Array.new(3) do |t|
        Thread.new do
          i = 0
          until stop
            begin
              bus.publish("/t", [t, i += 1])
            rescue => e
              errors << "#{e.class}: #{e.message}"
            end
            sleep 0.001 if t.zero?
          end
        end
      end
      5.times do |round|
        sleep 0.2
        in_child { replace_and_publish(Array.new(5) { |i| "#{round}.#{i}" }, channel: "/t") }
      end
      sleep 0.3
      stop = true
      publishers.each(&:join)
      assert_empty Array.new(errors.size) { errors.pop }.uniq.first(3), "fsync #{fsync}"
      fresh = Herald::Store::Log.new(dir: @dir)
      stored = fresh.global_backlog(0)
      assert_equal fresh.epoch, wait_for { store.known_epoch == fresh.epoch && store.known_epoch }
      assert_equal stored.map(&:global_id).sort, stored.map(&:global_id)
      wait_for { got.size >= stored.size }
      sleep 0.2
      delivered = Array.new(got.size) { got.pop }
      assert_equal stored.map(&:data), delivered.last(stored.size), "fsync #{fsync}: the last directory's messages"
      fresh.close
    end
  end

  # A writer keeping the lease whose directory is deleted before the listener looks (pinned here by holding
  # off the listener's look) finds the files gone when it next reserves ids: it opens a new directory and
  # writes the publish there, instead of raising the OS's Errno::ENOENT (CI: a publisher got it while another
  # process wiped and recreated the directory; on the old code this test gets it after 1,024 publishes).
  def test_a_publish_that_finds_the_files_gone_is_written_into_a_new_directory
    bus = open_bus
    store = bus.store
    bus.publish("/chat", {"text" => "old"})
    store.instance_variable_set(:@directory_checked_at, Float::INFINITY) # the listener does not look
    FileUtils.rm_rf(@dir)
    published = 0
    until store.resets == 1 # the next reservation finds the directory gone (ids are reserved 1,024 or more ahead)
      flunk "no reset after #{published} publishes" if published > 20_000
      bus.publish("/chat", {"text" => "n #{published} é"})
      published += 1
    end
    after = bus.publish_message("/chat", {"text" => "after 🎉"})
    fresh = Herald::Store::Log.new(dir: @dir)
    texts = fresh.backlog("/chat").map { |m| JSON.parse(m.payload)["text"] }
    assert_equal ["n #{published - 1} é", "after 🎉"], texts, "the publish that found the files gone, then the next, in the new directory"
    assert_equal fresh.epoch, store.known_epoch
    assert_equal after.global_id, fresh.last_global_id
    fresh.close
  end

  private

  def open_bus
    # (Without on_reset, so that the test runs, and fails, against a store that did not have it.)
    told = Herald::Store::Log.instance_method(:initialize).parameters.any? { |_, name| name == :on_reset }
    store = Herald::Store::Log.new(dir: @dir, **(told ? {on_reset: ->(old, new) { @resets << [old, new] }} : {}))
    Herald::Bus.new(store: store).tap { |bus| (@buses ||= []) << bus }
  end

  # Another process: what an operator's script and a freshly started worker do.
  def in_child(&block)
    pid = fork do
      block.call
      exit!(0)
    rescue Exception => e # standard:disable Lint/RescueException
      warn e.full_message
      exit!(1)
    end
    Process.wait(pid)
    assert $?.success?, "the child failed"
  end

  def replace_and_publish(texts, channel: "/chat")
    FileUtils.rm_rf(@dir)
    FileUtils.mkdir_p(@dir)
    bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir))
    texts.each { |t| bus.publish(channel, {"text" => t}) }
    bus.close
  end

  def wait_for
    deadline = monotonic + BOUND
    loop do
      value = yield
      return value if value
      flunk "not within #{BOUND} s" if monotonic > deadline
      sleep 0.01
    end
  end

  def pop(queue) = wait_for { queue.pop(true) unless queue.empty? }

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
