# frozen_string_literal: true

require_relative "../../test_helper"

# Forked publishers on one log directory while the holder of the write lease is killed with SIGKILL, again
# and again (a replacement is forked each time), and a reader in another process follows with "id > last".
# What must hold, whatever the timing (the seed is printed; HERALD_SEED=n repeats a run's choices):
# global ids dense (1..n), unique and in file order; each channel's ids dense; every publish that returned
# (acknowledged) is in the log with the ids it returned; each writer's records in its own order; and the
# reader saw every id, in order: no late commit below an id it had already passed.
class LogKilledHolderTest < Minitest::Test
  WRITERS = 3
  KILLS = 4

  def setup
    @dir = Dir.mktmpdir("herald-killed")
    @seed = Integer(ENV.fetch("HERALD_SEED", Random.new_seed % 1_000_000))
    @random = Random.new(@seed)
    puts "#{self.class.name}##{name}: HERALD_SEED=#{@seed}"
    @pids = []
  end

  def teardown
    @pids.each do |pid|
      Process.kill(:KILL, pid)
    rescue Errno::ESRCH
      nil
    end
    @pids.each do |pid|
      Process.wait(pid)
    rescue Errno::ECHILD
      nil
    end
    @stores&.each(&:close)
    FileUtils.rm_rf(@dir)
  end

  def test_killing_the_lease_holder_loses_nothing_acknowledged_interval
    assert_survives_killed_holders(fsync: :interval, per_writer: 4000)
  end

  def test_killing_the_lease_holder_loses_nothing_acknowledged_always
    assert_survives_killed_holders(fsync: :always, per_writer: 600)
  end

  private

  def open_store(fsync) = Herald::Store::Log.new(dir: @dir, fsync: fsync, max_backlog_size: 1_000_000).tap { |s| (@stores ||= []) << s }

  def codec = Herald::Codec::Json

  # A publisher: `per_writer` messages, every other one on a channel all writers share; each acknowledged
  # publish is written to its ack file (one write(2) a line) once append returned.
  def spawn_writer(id, fsync, per_writer)
    pid = fork do
      store = Herald::Store::Log.new(dir: @dir, fsync: fsync, max_backlog_size: 1_000_000)
      acks = File.open(File.join(@dir, "ack-#{id}"), "w")
      acks.sync = true
      per_writer.times do |seq|
        channel = seq.even? ? "/shared" : "/w#{id}"
        msg = store.append(channel, codec.encode([id, seq, "é🎉\0"]), codec: codec)
        acks.write("#{seq} #{msg.global_id} #{msg.message_id} #{channel}\n")
      end
      store.close
      exit!(0)
    end
    @pids << pid
    pid
  end

  # The pid holding LOCK's flock (Linux /proc/locks), nil when nobody does.
  def lock_holder
    inode = ":#{File.stat(File.join(@dir, "LOCK")).ino}"
    File.foreach("/proc/locks") do |line|
      fields = line.split
      return Integer(fields[4]) if fields[1] == "FLOCK" && fields[3] == "WRITE" && fields[5]&.end_with?(inode)
    end
    nil
  rescue Errno::ENOENT
    nil
  end

  def assert_survives_killed_holders(fsync:, per_writer:)
    reader = open_store(fsync)
    seen = []
    follow = Thread.new do
      loop do
        reader.wait(seen.last || 0, timeout: 0.05)
        seen.concat(reader.global_backlog(seen.last || 0).map(&:global_id))
      end
    end
    ids = {} # pid => writer id
    writers = WRITERS.times.map { |id| spawn_writer(id, fsync, per_writer).tap { |pid| ids[pid] = id } }
    next_id = WRITERS
    killed = []
    finished = {} # pid => status of the writers reaped while looking for live ones
    KILLS.times do
      sleep @random.rand(0.05..0.3)
      live = writers.reject { |pid| (done = Process.wait2(pid, Process::WNOHANG)) && (finished[pid] = done.last) }
      # (:always holds the lock only while it writes a batch, not over its sync: look until it is seen)
      holder = nil
      500.times do
        holder = lock_holder
        break if live.include?(holder)
        sleep 0.0002
      end
      victim = live.include?(holder) ? holder : live.sample(random: @random)
      break unless victim
      Process.kill(:KILL, victim)
      Process.wait(victim)
      killed << [ids[victim], victim == holder]
      writers.delete(victim)
      writers << spawn_writer(next_id, fsync, per_writer).tap { |pid| ids[pid] = next_id }
      next_id += 1
    end
    writers.each { |pid| assert (finished[pid] || Process.wait2(pid).last).success?, "writer #{pid} failed" }
    all = open_store(fsync).global_backlog(0)
    total = all.last.global_id
    eventually(timeout: 10, message: "the reader caught up to #{total}") { seen.last == total }
    follow.kill.join
    gids = all.map(&:global_id)
    info = "seed #{@seed}, killed #{killed.inspect} (writer, was the lease holder), #{gids.size} records"
    assert_dense gids, "global ids dense, unique, in file order (#{info})"
    assert gids == seen, "the reader in another process saw every id once, in order: #{first_difference(gids, seen)} (#{info})"
    all.group_by(&:channel).each do |channel, msgs|
      assert_dense msgs.map(&:message_id), "#{channel}: message ids dense (#{info})"
    end
    by_gid = all.to_h { |m| [m.global_id, m] }
    next_id.times do |id|
      acks = File.exist?(File.join(@dir, "ack-#{id}")) ? File.readlines(File.join(@dir, "ack-#{id}")) : [] # (killed before it opened)
      acks = acks.select { |l| l.end_with?("\n") }.map(&:split)
      acks.each do |seq, gid, mid, channel|
        msg = by_gid[Integer(gid)]
        assert msg, "writer #{id}: acknowledged id #{gid} missing (#{info})"
        assert_equal [[id, Integer(seq), "é🎉\0"], Integer(mid), channel], [msg.data, msg.message_id, msg.channel],
          "writer #{id}: acknowledged #{gid} holds what was published (#{info})"
      end
      mine = all.map(&:data).select { |d| d[0] == id }.map { |d| d[1] }
      assert_dense mine.map(&:succ), "writer #{id}'s records in its order, none missing in between (#{info})"
      assert_operator mine.size, :>=, acks.size, "writer #{id}: nothing acknowledged lost (#{info})"
      assert_equal per_writer, mine.size, "writer #{id} (not killed) published everything (#{info})" unless killed.assoc(id)
    end
    assert_operator killed.count(&:last), :>=, 1, "at least one lease holder was killed (#{info})"
    assert_empty reader.corrupt_records, info
  end

  # 1..n, without printing thousands of ids when it is not.
  def assert_dense(ids, message)
    assert ids == (1..ids.size).to_a, "#{message}: #{first_difference((1..ids.size).to_a, ids)}"
  end

  def first_difference(expected, actual)
    i = expected.zip(actual).index { |a, b| a != b } || [expected.size, actual.size].min
    "from index #{i}: expected #{expected[i, 3].inspect}, got #{actual[[i - 2, 0].max, 5].inspect} (sizes #{expected.size}, #{actual.size})"
  end
end
