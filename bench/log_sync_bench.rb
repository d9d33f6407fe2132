# frozen_string_literal: true

# What one fdatasync costs on this disk, for the shapes fsync: :always could take (docs/log.md), rows
# interleaved round by round:
#   append      write at the end of the file (i_size grows: ext4 commits its journal in every sync)
#   fallocate   append into blocks allocated ahead past the end (fallocate FALLOC_FL_KEEP_SIZE): the size
#               still grows, but no block is allocated at sync time
#   overwrite   write into a file already filled with zeros and synced (no metadata changes: the sync is
#               the data page and a cache flush)
# each from 1 thread (one sync at a time, 1 or 8 records a write) and from 8 threads each writing its own
# record and syncing at once (do concurrent syncs overlap?), and 1 thread while another process spins on a core.
# Two rows wait GAP before each write, idle (sleep: both cores may halt) or busy (spinning): with 8 threads the
# group commit's batch sync follows ~200 us of hand-offs during which the cores mostly idle (docs/log.md).
#
#   bundle exec ruby bench/log_sync_bench.rb        # BENCH_ROUNDS=5 BENCH_SYNCS=300
require "tmpdir"
require "fiddle"

ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "5"))
SYNCS = Integer(ENV.fetch("BENCH_SYNCS", "300"))
RECORD = ("x" * 150).b.freeze
PREFILL = 16 * 1024 * 1024

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

FALLOCATE = Fiddle::Function.new(Fiddle.dlopen(nil)["fallocate"],
  [Fiddle::TYPE_INT, Fiddle::TYPE_INT, Fiddle::TYPE_LONG_LONG, Fiddle::TYPE_LONG_LONG], Fiddle::TYPE_INT)
KEEP_SIZE = 1 # FALLOC_FL_KEEP_SIZE: blocks allocated past the end, the file's size unchanged

# A file to write into, and where the next record goes.
class Target
  def initialize(dir, name, prefill)
    @io = File.new(File.join(dir, name), File::RDWR | File::CREAT | File::TRUNC | File::BINARY)
    if prefill == :keep_size
      raise "fallocate failed" unless FALLOCATE.call(@io.fileno, KEEP_SIZE, 0, PREFILL).zero?
      @io.fsync
    elsif prefill
      chunk = "\0".b * (1024 * 1024)
      (PREFILL / chunk.bytesize).times { @io.write(chunk) }
      @io.fsync
    end
    @pos = 0
    @mutex = Mutex.new
  end

  def claim(bytes) = @mutex.synchronize { @pos.tap { @pos += bytes } }

  def rewind = (@pos = 0)

  def write_sync(bytes)
    @io.pwrite(bytes, claim(bytes.bytesize))
    t = now
    @io.fdatasync
    now - t
  end

  def close = @io.close
end

GAP = 0.0002

def busy_wait(seconds)
  stop = now + seconds
  nil while now < stop
end

def run(target, threads, per_write, spin: false, gap: nil)
  bytes = RECORD * per_write
  spinner = fork { loop {} } if spin # a process, not a thread: a spinning thread keeps the GVL 100 ms at a time
  lat = []
  started = now
  Array.new(threads) do
    Thread.new do
      Array.new(SYNCS / threads) do
        if gap == :idle
          sleep(GAP)
        elsif gap == :busy
          busy_wait(GAP)
        end
        target.write_sync(bytes)
      end
    end
  end.each { |t| lat.concat(t.value) }
  wall = now - started
  if spinner
    Process.kill(:KILL, spinner)
    Process.wait(spinner)
  end
  lat.sort!
  {rate: lat.size / wall, records: lat.size * per_write / wall, p50: lat[lat.size / 2] * 1e6, p90: lat[lat.size * 9 / 10] * 1e6}
end

Dir.mktmpdir("herald-sync", ENV.fetch("BENCH_DIR", Dir.pwd)) do |dir|
  append = Target.new(dir, "append", false)
  over = Target.new(dir, "over", true)
  kept = Target.new(dir, "kept", :keep_size)
  rows = {
    "append, 1 thread, 1 record a sync" => -> { run(append, 1, 1) },
    "append, 1 thread, 8 records a sync" => -> { run(append, 1, 8) },
    "append, 1 thread, another process spinning" => -> { run(append, 1, 1, spin: true) },
    "append, 1 thread, idle #{(GAP * 1e6).round} us (sleep) before each write" => -> { run(append, 1, 1, gap: :idle) },
    "append, 1 thread, busy #{(GAP * 1e6).round} us (spin) before each write" => -> { run(append, 1, 1, gap: :busy) },
    "append, 8 threads syncing at once" => -> { run(append, 8, 1) },
    "append, 2 threads syncing at once, 4 records a sync" => -> { run(append, 2, 4) },
    "fallocate KEEP_SIZE ahead, append, 1 thread, 1 record a sync" => -> { run(kept, 1, 1) },
    "fallocate KEEP_SIZE ahead, append, 1 thread, 8 records a sync" => -> { run(kept, 1, 8) },
    "overwrite, 1 thread, 1 record a sync" => -> { run(over, 1, 1) },
    "overwrite, 1 thread, 8 records a sync" => -> { run(over, 1, 8) },
    "overwrite, 8 threads syncing at once" => -> { run(over, 8, 1) },
    "overwrite, 2 threads syncing at once, 4 records a sync" => -> { run(over, 2, 4) }
  }
  samples = Hash.new { |h, k| h[k] = [] }
  load_before = File.read("/proc/loadavg").split.first(3).join(" ")
  ROUNDS.times { rows.each { |name, row| samples[name] << row.call } }
  load_after = File.read("/proc/loadavg").split.first(3).join(" ")
  med = ->(a) { a.sort[a.size / 2] }
  puts "#{ROUNDS} rounds, #{SYNCS} syncs a row a round, load #{load_before} before, #{load_after} after", ""
  puts "| | syncs/s | records/s | sync p50 us | sync p90 us |", "|---|---:|---:|---:|---:|"
  rows.each_key do |name|
    s = samples[name]
    puts format("| %s | %d (%d-%d) | %d | %d | %d |", name, med.call(s.map { _1[:rate] }), s.map { _1[:rate] }.min, s.map { _1[:rate] }.max,
      med.call(s.map { _1[:records] }), med.call(s.map { _1[:p50] }), med.call(s.map { _1[:p90] }))
  end
  [append, over, kept].each(&:close)
end
