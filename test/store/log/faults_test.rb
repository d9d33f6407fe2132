# frozen_string_literal: true

require_relative "../../test_helper"
require "open3"

# A full disk, a file-size limit and a read-only directory: a named error, and what was stored stays readable.
class LogFaultsTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("herald-faults")
    @mounts = []
    @made = [] # mount points, removed after unmounting
  end

  def teardown
    FileUtils.chmod_R("u+w", @dir) if File.directory?(@dir)
    @mounts.reverse_each { |m| system("umount", "-l", m, err: File::NULL) }
    @made.each { |d| FileUtils.rm_rf(d) }
    FileUtils.rm_rf(@dir)
  end

  def test_a_full_disk_raises_store_full_and_stored_messages_stay_readable
    dir = mount_tmpfs("size=256k")
    store = Herald::Store::Log.new(dir: dir, fsync: :always)
    stored = fill(store) { |i| "x" * 1000 + i.to_s }
    error = assert_raises(Herald::StoreFullError) { append(store, "x" * 4000) }
    assert_match(/free disk space/, error.message)
    assert_operator stored.size, :>, 50
    assert_equal stored, store.global_backlog(0).map(&:data)
    store.close
    assert_equal stored, reopened(dir) { |s| s.global_backlog(0).map(&:data) }, "no half record left behind"
  end

  def test_a_file_size_limit_raises_store_full_when_sigxfsz_is_ignored
    out = in_child do
      trap("XFSZ", "IGNORE")
      Process.setrlimit(:FSIZE, 64 * 1024)
      store = Herald::Store::Log.new(dir: @dir, fsync: :never)
      count = fill(store) { |i| "y" * 500 + i.to_s }.size
      begin
        append(store, "y" * 4000)
        "no error"
      rescue Herald::StoreFullError => e
        "#{count} #{e.class} #{e.message}"
      end
    end
    count, name, message = out.split(" ", 3)
    assert_equal "Herald::StoreFullError", name
    assert_match(/file-size limit/, message)
    assert_equal Integer(count), reopened(@dir) { |s| s.global_backlog(0).size }
  end

  def test_a_process_killed_by_sigxfsz_leaves_a_log_that_recovers
    in_child(expect_success: false) do
      Process.setrlimit(:FSIZE, 64 * 1024)
      store = Herald::Store::Log.new(dir: @dir, fsync: :never)
      loop { append(store, "z" * 700) } # dies of SIGXFSZ half way through a record
    end
    found = reopened(@dir) { |s| [s.global_backlog(0).map(&:data).uniq, s.corrupt_records.size] }
    assert_equal [["z" * 700], 0], found
  end

  def test_a_read_only_bind_mount_can_be_read_but_refuses_appends
    write_some(@dir)
    ro = Dir.mktmpdir("herald-ro").tap { |d| @made << d }
    mount("--bind", @dir, ro)
    mount("-o", "remount,bind,ro", ro)
    store = Herald::Store::Log.new(dir: ro)
    assert_equal [0, 1, 2], store.backlog("/f", 0).map(&:data)
    error = assert_raises(Herald::ReadOnlyError) { append(store, 3) }
    assert_match(/read-only/, error.message)
    assert_raises(Herald::ReadOnlyError) { store.save_cursor("c", 1) }
    store.close
  end

  def test_an_unprivileged_process_can_read_a_directory_it_cannot_write
    write_some(@dir)
    Dir.mkdir(File.join(@dir, "never-opened"))
    FileUtils.chmod_R("a+rX", @dir)
    FileUtils.chmod("go-w", @dir)
    FileUtils.chmod_R("a-w", @dir) unless Process.uid.zero? # root ignores mode bits: it drops to nobody below
    out = in_child do
      if Process.uid.zero?
        Process::Sys.setgid(65_534)
        Process::Sys.setuid(65_534)
      end
      empty = Herald::Store::Log.new(dir: File.join(@dir, "never-opened")) # no segments, no subdirectories
      raise "not empty" unless empty.last_global_id.zero? && empty.global_backlog(0).empty?
      store = Herald::Store::Log.new(dir: @dir)
      data = store.backlog("/f", 0).map(&:data).join(",")
      begin
        append(store, 9)
      rescue Herald::ReadOnlyError => e
        "#{data} #{e.class}"
      end
    end
    assert_equal "0,1,2 Herald::ReadOnlyError", out
  end

  # strace injects EIO into the segment's fsyncs (Ruby's IO#fdatasync falls back to fsync, so both).
  def test_a_failed_fsync_is_fatal_for_the_store_instance
    skip "SKIPPED LOUDLY: strace is not installed; this test needs it to inject fsync errors" unless system("which strace", out: File::NULL)
    Herald::Store::Log.new(dir: @dir).close # creates the first segment, so strace can filter on its path
    script = <<~RUBY
      require "herald"
      s = Herald::Store::Log.new(dir: ARGV[0], fsync: :always)
      c = Herald::Codec::Json
      2.times do
        s.append("/a", c.encode(1), codec: c)
        puts "stored"
      rescue Herald::DurabilityError => e
        puts e.class
      end
      puts s.global_backlog(0).size
    RUBY
    out, _status = Open3.capture2e("strace", "-f", "-qq", "-o", File::NULL, "-P", File.join(@dir, "00000000000000000001.log"),
      "-e", "trace=fdatasync,fsync", "-e", "inject=fdatasync,fsync:error=EIO",
      RbConfig.ruby, "-I", File.expand_path("../../../lib", __dir__), "-e", script, @dir)
    assert_equal ["Herald::DurabilityError", "Herald::DurabilityError", "1"], out.lines.map(&:strip).last(3),
      "the first append fails its fsync, the second is refused without writing (output: #{out})"
  end

  private

  def append(store, data) = store.append("/f", json_codec.encode(data), codec: json_codec)

  # Appends until the store refuses; returns the data stored.
  def fill(store)
    stored = []
    10_000.times do |i|
      data = yield(i)
      append(store, data)
      stored << data
    rescue Herald::StoreFullError
      return stored
    end
    stored
  end

  def write_some(dir)
    store = Herald::Store::Log.new(dir: dir, fsync: :never)
    3.times { |i| append(store, i) }
    store.close
  end

  def reopened(dir, &block)
    store = nil
    capture_io { store = Herald::Store::Log.new(dir: dir, fsync: :never) }
    block.call(store)
  ensure
    store&.close
  end

  # Runs the block in a forked child; returns what it returned, as a String.
  def in_child(expect_success: true)
    r, w = IO.pipe
    pid = fork do
      r.close
      w.write(yield.to_s)
      exit!(0)
    rescue => e
      w.write("#{e.class}: #{e.message}")
      exit!(1)
    end
    w.close
    out = r.read
    status = Process.wait2(pid).last
    assert status.success?, "child failed: #{out}" if expect_success
    out
  end

  def mount_tmpfs(options)
    dir = Dir.mktmpdir("herald-tmpfs").tap { |d| @made << d }
    mount("-t", "tmpfs", "-o", options, "tmpfs", dir)
    dir
  end

  def mount(*args)
    target = args.last
    out, status = Open3.capture2e("mount", *args)
    skip "SKIPPED LOUDLY: cannot mount (#{out.strip}); this test needs root with mount rights" unless status.success?
    @mounts << target unless @mounts.include?(target)
  end
end
