# frozen_string_literal: true

require_relative "events_helper"
require "securerandom"

# Deferred handlers raising every kind of exception, with two worker processes sharing the subscribers'
# leases (the Log store's flock), as a Puma cluster or a primary and a standby run them: nothing stalls, a
# standby takes over when the holder's worker thread dies, a handler stopping the process hands over first,
# and one poison event gives one dead letter, even when the holder is killed between burying it and saving
# its cursor. (Before: a SystemStackError, NotImplementedError or LoadError killed the worker thread with
# nothing logged, every subscriber on it stopped, the other process never took over, and a restart buried
# the same event again.)
class HandlerFaultsTest < Minitest::Test
  include Herald::EventsTestSupport

  CustomFault = Class.new(Exception) # standard:disable Lint/InheritException
  KINDS = %w[StandardError SystemStackError NotImplementedError LoadError NoMemoryError CustomFault].freeze
  POISON_EVERY = 10

  # A Log store whose owner is killed (kill -9) the moment a dead letter is stored: before the worker
  # saves its cursor past the event.
  class CrashAfterDeadLetter < Herald::Store::Log
    def append(channel, payload, **options)
      msg = super
      Process.kill(:KILL, Process.pid) if channel.start_with?(Herald::Events::DeadLetters::PREFIX)
      msg
    end
  end

  def self.deep(n) = deep(n + 1) + 1

  # What poison event `n` raises: each kind in turn, the real thing where Ruby makes it cheaply.
  def self.fail_as(n)
    case KINDS[(n / POISON_EVERY - 1) % KINDS.size]
    when "StandardError" then raise ArgumentError, "card declined é 🎉"
    when "SystemStackError" then deep(0)
    when "NotImplementedError" then raise NotImplementedError, "fork() is not on this platform"
    when "LoadError" then require "herald/no_such_file_#{n}"
    when "NoMemoryError" then raise NoMemoryError, "failed to allocate memory"
    else raise CustomFault, "the app's own Exception subclass"
    end
  end

  def test_handlers_raising_every_kind_of_exception_stall_nothing_across_two_processes
    dir = File.join(@tmp, "kinds")
    total = 180
    publish_numbered(dir, 1..total / 2)
    files = {ok: File.join(dir, "poison_ok"), healthy: File.join(dir, "healthy")}
    started = monotonic
    pids = Array.new(2) { |i| fork_child { kinds_worker(dir, files, File.join(dir, "log#{i}")) } }
    publish_numbered(dir, (total / 2 + 1)..total, pause: 0.002) # live, from a third process
    poison = (1..total).select { |n| n % POISON_EVERY == 0 }
    counts = nil
    done = wait_for(30) do
      counts = {healthy: lines(files[:healthy]).size, ok: lines(files[:ok]).size, dead: dead_letters(dir, "Poison").size}
      counts[:healthy] >= total && counts[:ok] >= total - poison.size && counts[:dead] >= poison.size
    end
    took = monotonic - started
    pids.each { |p| Process.kill(:KILL, p) }
    pids.each { |p| Process.wait(p) }
    logs = Dir[File.join(dir, "log*")].map { |f| File.read(f) }.join
    assert done, "stalled after #{took.round(1)} s: #{counts.inspect} of healthy #{total}, ok #{total - poison.size}, " \
      "dead #{poison.size}; logs:\n#{logs[-3000..] || logs}"

    healthy = lines(files[:healthy]).map { |l| l.split.last.to_i }
    assert_equal (1..total).to_a, healthy.sort, "the healthy subscriber on the same thread handled each event once"
    assert_equal (1..total).to_a - poison, lines(files[:ok]).map(&:to_i).sort
    letters = dead_letters(dir, "Poison")
    by_event = letters.group_by { |l| l.message.data.n }
    assert_equal poison, by_event.keys.sort
    assert_equal [1], by_event.values.map(&:size).uniq, "one dead letter per poison event"
    expected = poison.to_h { |n| [n, expected_error(n)] }
    assert_equal expected, by_event.transform_values { |(l)| l.error }
    assert_equal [2], letters.select { |l| l.error == "ArgumentError" }.map(&:attempts).uniq, "retried as retry_on says"
    assert_equal poison.size, logs.scan("ERROR: deferred subscriber Poison gave up on ").size, "each one logged"
    puts "\nevery kind of exception (#{KINDS.join(", ")}), 2 processes, 1 thread each: healthy #{healthy.size}/#{total}, " \
      "poison subscriber handled #{total - poison.size}/#{total - poison.size}, dead letters #{letters.size} for #{poison.size} " \
      "poison events (#{by_event.values.map(&:size).max} per event), stalls 0, all done in #{took.round(2)} s"
  end

  # A handler that kills its own worker thread (Thread.exit: nothing rescues it) in the lease holder: the
  # holder logs it, saves the cursor and frees the leases at once, and the standby process takes over from
  # the event in flight; nothing before it runs again, nothing stalls.
  def test_the_standby_takes_over_when_the_holders_worker_thread_dies
    takeover_trial("Log store (flock leases)")
  end

  # The same on Redis, whose lease is a key renewed every 10 s by the holder (on 9129422 the renewer kept the
  # dead thread's lease forever).
  def test_the_standby_takes_over_on_redis_when_the_holders_worker_thread_dies
    require_relative "../support/servers"
    @redis = Herald::TestServers.redis_url # started here, not in each forked worker
    @redis_ns = "hf#{SecureRandom.hex(4)}"
    takeover_trial("Redis (key leases, 30 s TTL)")
  end

  def takeover_trial(label)
    dir = File.join(@tmp, "takeover")
    FileUtils.mkdir_p(dir)
    total = 100
    publish_numbered(dir, 1..total)
    out, marker = File.join(dir, "handled"), File.join(dir, "died")
    pids = Array.new(2) { |i| fork_child { mortal_worker(dir, out, marker, File.join(dir, "log#{i}")) } }
    done = wait_for(20) { lines(out).count { |l| l.start_with?("Mortal ") } >= total }
    publish_numbered(dir, (total + 1)..(total + 20)) if done # live ones after the takeover
    # Both subscribers: the bystander's worker runs on after Mortal's last event (CI at load 13: killed at its 101st).
    done &&= wait_for(10) do
      handled = lines(out)
      handled.count { |l| l.start_with?("Mortal ") } >= total + 20 && handled.count { |l| l.start_with?("Bystander ") } >= total + 20
    end
    pids.each { |p| Process.kill(:KILL, p) }
    pids.each { |p| Process.wait(p) }
    holder, died_at = File.read(marker).split.then { |pid, t| [pid.to_i, t.to_f] }
    rows = lines(out).map(&:split).map { |name, pid, n, t| [name, pid.to_i, n.to_i, t.to_f] }
    logs = Dir[File.join(dir, "log*")].map { |f| File.read(f) }.join
    assert done, "the standby never took over: #{rows.count { |r| r[0] == "Mortal" }} of #{total + 20} handled; logs:\n#{logs}"

    mortal = rows.select { |r| r[0] == "Mortal" }
    by_holder = mortal.select { |r| r[1] == holder }.map { |r| r[2] }
    after = mortal.drop(by_holder.size)
    standby = after.first
    refute_equal holder, standby[1], "the standby process took over"
    takeover = standby[3] - died_at
    assert_equal (1..39).to_a, by_holder, "the holder handled 1..39 and died in 40"
    assert_equal (40..total + 20).to_a, after.map { |r| r[2] }, "the standby resumed at the event in flight, in order, once each"
    assert_operator takeover, :<, 4 * Herald::Events::Worker::LEASE_RETRY, "taken over within a few lease retries (0.5 s each)"
    bystander = rows.select { |r| r[0] == "Bystander" }.map { |r| r[2] }
    assert_equal (1..total + 20).to_a, bystander.uniq.sort, "the subscriber sharing the thread went on too"
    assert_match(/ERROR: deferred subscribers Mortal, Bystander: their worker thread was killed; leases released/, logs)
    puts "\n#{label}: worker thread killed by its handler in the lease holder: standby took over after #{(takeover * 1000).round} ms " \
      "at event #{standby[2]} (holder did 1..#{by_holder.last}), #{mortal.size} handled for #{total + 20} events, stalls 0"
  end

  # SystemExit and Interrupt from a handler mean the process: the holder saves the exact cursor, frees
  # its leases, and the exception goes on to the main thread (the process exits); the standby resumes at
  # that event without running any earlier one again (a slow handler: the cursor is saved by time, every
  # 50 ms, so without the hand-over several would run twice).
  def test_a_handler_raising_system_exit_or_interrupt_hands_over_then_stops_the_process
    [SystemExit, Interrupt].each do |kind|
      dir = File.join(@tmp, "stop-#{kind}")
      publish_numbered(dir, 1..60)
      out, status_file = File.join(dir, "handled"), File.join(dir, "status")
      pids = Array.new(2) { |i| fork_child { stopping_worker(dir, out, status_file, kind, File.join(dir, "log#{i}")) } }
      done = wait_for(20) { lines(out).count { |l| l.start_with?("done ") } >= 60 }
      stopped = pids.find { |p| Process.wait(p, Process::WNOHANG) }
      (pids - [stopped]).each { |p| Process.kill(:KILL, p) && Process.wait(p) }
      assert done, "#{kind}: the standby never took over: #{lines(out).last(5).inspect}"
      assert stopped, "#{kind}: the process whose handler raised it is still running (it was not propagated)"
      assert_equal kind.name, File.read(status_file).strip, "the main thread got it"
      logs = Dir[File.join(dir, "log*")].map { |f| File.read(f) }.join
      assert_match(/ERROR: deferred subscribers Stopper: a handler raised #{kind}: stop the process .*; cursors saved and leases released, raising it in the main thread/, logs)
      rows = lines(out).map(&:split)
      holder = rows.find { |r| r[1] == "30" }[2]
      assert_equal ["start", "30", holder], rows.find { |r| r[1] == "30" }
      by_holder = rows.select { |r| r[0] == "done" && r[2] == holder }.map { |r| r[1].to_i }
      by_standby = rows.select { |r| r[0] == "done" && r[2] != holder }.map { |r| r[1].to_i }
      assert_equal (1..29).to_a, by_holder
      assert_equal (30..60).to_a, by_standby, "#{kind}: the standby resumed at the event that stopped the holder, none before it twice"
    end
  end

  # kill -9 right after a dead letter is stored, before the cursor is saved past it (injected: the store
  # kills its process when it appends a dead letter). Two processes share the subscriber; each one killed
  # is replaced. Every poison event costs exactly one kill and leaves exactly one dead letter. (Before:
  # the next owner ran the event again and buried it again, and again, at every restart.)
  def test_one_dead_letter_per_poison_event_when_killed_between_the_dead_letter_and_the_cursor
    dir = File.join(@tmp, "crash")
    total = 60
    publish_numbered(dir, 1..total)
    poison = (1..total).select { |n| n % POISON_EVERY == 0 }
    others = (1..total).to_a - poison
    out = File.join(dir, "handled")
    kills = 0
    spawned = 0
    children = []
    deadline = monotonic + 40
    until (done = dead_letters(dir, "Fragile").size >= poison.size && (others - lines(out).map(&:to_i)).empty?) ||
        spawned > 3 * poison.size || monotonic > deadline
      while children.size < 2
        children << fork_child { fragile_worker(dir, out) }
        spawned += 1
      end
      children.reject! do |pid|
        next false unless Process.wait(pid, Process::WNOHANG)
        kills += 1 if $?.termsig == 9
        true
      end
      sleep 0.02
    end
    sleep 0.5 # the owner that stored the last dead letter killed itself: reap it before killing the rest
    children.each do |pid|
      if Process.wait(pid, Process::WNOHANG)
        kills += 1 if $?.termsig == 9
      else
        Process.kill(:KILL, pid)
        Process.wait(pid)
      end
    end
    letters = dead_letters(dir, "Fragile").group_by { |l| l.message.data.n }
    counts = letters.transform_values(&:size)
    assert done, "did not get through the log: #{spawned} processes, #{kills} killed, dead letters per event #{counts.inspect}"
    assert_equal poison, letters.keys.sort
    assert_equal [1], counts.values.uniq, "one dead letter per poison event: #{counts.inspect}"
    assert_equal poison.size, kills, "one kill per poison event"
    handled = lines(out).map(&:to_i)
    assert_equal others, handled.uniq.sort, "every other event handled"
    puts "\nkill -9 between each dead letter and the cursor's save, 2 processes: #{kills} kills, #{spawned} processes, " \
      "#{counts.values.sum} dead letters for #{poison.size} poison events (#{counts.values.max} per event), " \
      "#{handled.size} handler runs for #{others.size} other events"
  end

  private

  def open_store(dir)
    return Herald::Store::Log.new(dir: dir, fsync: :never) unless @redis
    Herald::Store::Redis.new(url: @redis, namespace: @redis_ns)
  end

  def publish_numbered(dir, range, pause: 0)
    store = open_store(dir)
    range.each do |n|
      store.append("/events/herald/events_test_support/numbered", Herald::Codec::Event.encode(Numbered.new(n)),
        codec: Herald::Codec::Event, max_backlog_size: 100_000)
      sleep pause if pause > 0
    end
    store.close
  end

  def dead_letters(dir, name)
    store = Herald::Store::Log.new(dir: dir, fsync: :never)
    Herald::Events::DeadLetters.new(store).list(name)
  ensure
    store&.close
  end

  def expected_error(n)
    kind = KINDS[(n / POISON_EVERY - 1) % KINDS.size]
    {"StandardError" => "ArgumentError", "CustomFault" => CustomFault.name}.fetch(kind, kind)
  end

  def lines(path) = File.exist?(path) ? File.read(path).split("\n") : []

  def wait_for(seconds)
    deadline = monotonic + seconds
    until (ok = yield)
      break if monotonic > deadline
      sleep 0.05
    end
    ok
  end

  # In a child: the store, a logger into `log`, and an appender per file (flushed per write).
  def child_setup(dir, log: nil, store_class: Herald::Store::Log)
    Herald.reset!
    Herald::Events.registry.clear
    Herald.logger = ::Logger.new(log, formatter: proc { |sev, _, _, msg| "#{sev}: #{msg}\n" }) if log
    Herald.configure { |c| c.store = store_class.equal?(Herald::Store::Log) ? open_store(dir) : store_class.new(dir: dir, fsync: :never) }
  end

  def appender(path) = File.open(path, "a").tap { |f| f.sync = true }

  # Two subscribers on one worker thread: Poison raises a different kind of exception every 10th event.
  def kinds_worker(dir, files, log)
    child_setup(dir, log: log)
    ok, healthy = appender(files[:ok]), appender(files[:healthy])
    define_subscriber("Poison", Numbered, deferred: true, start: :oldest, retry_on: {attempts: 2, wait: 0.001}) do |e, _m|
      HandlerFaultsTest.fail_as(e.n) if e.n % POISON_EVERY == 0
      ok.write("#{e.n}\n")
    end
    define_subscriber("Healthy", Numbered, deferred: true, start: :oldest) { |e, _m| healthy.write("#{Process.pid} #{e.n}\n") }
    Herald.start_workers(threads: 1)
    sleep
  end

  # Mortal's handler kills its own thread at event 40, once (the first process to get there).
  def mortal_worker(dir, out, marker, log)
    child_setup(dir, log: log)
    f = appender(out)
    define_subscriber("Mortal", Numbered, deferred: true, start: :oldest) do |e, _m|
      if e.n == 40 && !File.exist?(marker)
        File.write(marker, "#{Process.pid} #{Process.clock_gettime(Process::CLOCK_MONOTONIC)}")
        Thread.current.kill
      end
      f.write("Mortal #{Process.pid} #{e.n} #{Process.clock_gettime(Process::CLOCK_MONOTONIC)}\n")
    end
    define_subscriber("Bystander", Numbered, deferred: true, start: :oldest) { |e, _m| f.write("Bystander #{Process.pid} #{e.n} 0\n") }
    Herald.start_workers(threads: 1)
    sleep
  end

  # A slow handler that raises `kind` at event 30, once; the main thread records what reached it.
  def stopping_worker(dir, out, status_file, kind, log)
    child_setup(dir, log: log)
    f = appender(out)
    define_subscriber("Stopper", Numbered, deferred: true, start: :oldest) do |e, _m|
      f.write("start #{e.n} #{Process.pid}\n")
      if e.n == 30 && File.write(File.join(dir, "raised"), "", mode: File::CREAT | File::EXCL | File::WRONLY)
        raise kind, "stop the process"
      end
      sleep 0.01
      f.write("done #{e.n} #{Process.pid}\n")
    rescue Errno::EEXIST
      sleep 0.01
      f.write("done #{e.n} #{Process.pid}\n")
    end
    Herald.start_workers(threads: 1)
    begin
      sleep
    rescue SystemExit, Interrupt => e
      File.write(status_file, e.class.name)
      exit!(0)
    end
  end

  def fragile_worker(dir, out)
    child_setup(dir, log: File::NULL, store_class: CrashAfterDeadLetter)
    f = appender(out)
    define_subscriber("Fragile", Numbered, deferred: true, start: :oldest) do |e, _m|
      HandlerFaultsTest.fail_as(e.n) if e.n % POISON_EVERY == 0
      f.write("#{e.n}\n")
    end
    Herald.start_workers(threads: 1)
    sleep
  end
end
