# frozen_string_literal: true

require "json"

# What a networked store (Redis, PostgreSQL) adds to StoreContract: several processes on one store.
# The including class defines `build_store(**options)`, `twin_store(store, **options)` (a second
# instance on the same data) and `disrupt!` (the server-side fault its reader must survive).
module NetworkedStoreContract
  # Runs the block in a forked child (which must not run at_exit hooks: they would stop the servers).
  def in_child
    fork do
      yield
    rescue Exception => e # standard:disable Lint/RescueException
      warn "child failed: #{e.class}: #{e.message}\n#{e.backtrace.first(5).join("\n")}"
      exit!(1)
    ensure
      exit!(0)
    end
  end

  def read_line(io, timeout: 10)
    Timeout.timeout(timeout) { io.gets&.chomp } or flunk "child closed its pipe"
  end

  def test_two_processes_see_each_others_messages_with_live_wakeups
    append("/from-parent", "before fork") # the parent's connections are open when it forks
    r, w = IO.pipe
    pid = in_child do
      r.close
      w.sync = true
      store = @store # the inherited object: it must reconnect, not share the parent's sockets
      last = store.last_global_id
      w.puts "ready #{last}"
      store.wait(last, timeout: 5)
      w.puts "woke #{Process.clock_gettime(Process::CLOCK_REALTIME)}"
      w.puts JSON.generate(store.global_backlog(last).map(&:data))
      store.append("/from-child", json_codec.encode("hello parent"), codec: json_codec)
      sleep 0.2
    end
    w.close
    assert_match(/\Aready \d+/, read_line(r))
    sleep 0.1
    sent_at = Process.clock_gettime(Process::CLOCK_REALTIME)
    live_id = @store.last_global_id + 1
    waiter = Thread.new { @store.wait(live_id, timeout: 5) } # for the child's append, after ours
    append("/from-parent", "live")
    woke_at = read_line(r).split.last.to_f
    assert_operator woke_at - sent_at, :<, 0.2, "the child was not woken at once (a poll, not a wakeup?)"
    assert_equal ["live"], JSON.parse(read_line(r))
    assert_operator waiter.value, :>, live_id, "the parent was not woken by the child's append"
    assert_equal ["hello parent"], @store.backlog("/from-child", 0).map(&:data)
    Process.wait(pid)
    assert_predicate $?, :success?
  end

  # Backlogs are cached per process until the listener hears of a change: a reader woken by another
  # instance's append must find the message in its next backlog read.
  def test_backlog_read_after_a_wakeup_includes_the_new_message
    append("/cache", 1)
    3.times do
      assert_equal [1], @store.backlog("/cache", 0).map(&:data)
      @store.wait(@store.last_global_id, timeout: 0.05)
    end
    other = twin_store(@store)
    3.times do |i|
      last = @store.last_global_id
      waiter = Thread.new { @store.wait(last, timeout: 5) }
      sleep 0.02
      append("/cache", i + 2, store: other)
      assert_operator waiter.value, :>, last
      assert_equal (1..i + 2).to_a, @store.backlog("/cache", 0).map(&:data)
      assert_equal [i + 2], @store.backlog("/cache", i + 1).map(&:data)
    end
  end

  def test_forked_children_publish_through_an_inherited_store
    append("/f", "parent")
    pids = 2.times.map { |i| in_child { 50.times { |n| append("/f", [i, n]) } } }
    pids.each { |pid| Process.wait(pid) }
    append("/f", "parent again") # the parent's connections still work
    backlog = @store.backlog("/f", 0)
    assert_equal (1..102).to_a, backlog.map(&:message_id)
    assert_equal 2.times.flat_map { |i| 50.times.map { |n| [i, n] } }.sort, backlog.map(&:data)[1..100].sort
  end

  # A reader in another process keeps reading through the fault: every message once, in order.
  def assert_reader_survives_disruption(expect_reset:)
    r, w = IO.pipe
    pid = in_child do
      r.close
      w.sync = true
      reader = twin_store(@store, on_reset: ->(_old, _new) { w.puts "reset" })
      bus = Herald::Bus.new(store: reader, on_error: ->(_e, _m) {})
      bus.subscribe("/d", 0) { |m| w.puts "#{m.message_id} #{m.data}" }
      sleep 30
    end
    w.close
    lines = []
    publish = ->(n) { retrying { append("/d", n) } }
    (1..10).each(&publish)
    lines << read_line(r) while lines.count { |l| l != "reset" } < 10
    disrupt!
    (11..20).each(&publish)
    lines << read_line(r, timeout: 15) while lines.count { |l| l != "reset" } < 20
    lines << read_line(r, timeout: 10) while expect_reset && !lines.include?("reset") # reported by its listener
    Process.kill(:KILL, pid)
    Process.wait(pid)
    messages = lines.reject { |l| l == "reset" }.map { |l| l.split.map(&:to_i) }
    assert_equal (1..20).to_a, messages.map(&:last), "every message once, in order"
    ids = messages.map(&:first)
    assert_equal ids.uniq.sort, ids, "message ids strictly increase: no old id delivered twice"
    assert_includes lines, "reset" if expect_reset
  ensure
    Process.kill(:KILL, pid) rescue nil # standard:disable Style/RescueModifier
  end
end
