# frozen_string_literal: true

require "fileutils"
require "json"

module Herald
  module Store
    class Log
      # The files of a log directory other than segments, and the one way they are written:
      #   LOCK            flock'ed around every append and every recovery (one writer at a time, any process)
      #   WAITERS         flock'ed (shared) by a writer blocked on LOCK, so a writer keeping LOCK sees it (WriteLease)
      #   META            epoch and segment size, fixed when the directory is created
      #   STATE           last ids and retention, saved before old segments are deleted (ids never go back)
      #   IDS             how far ids may have been handed out (Reservation); OPEN: flock'ed by every open store
      #   cursors/NAME    saved positions of durable readers
      #   leases/NAME     flock'ed by the owner of a lease; freed by the kernel when the owner dies
      #   wakeup/*.sock   one datagram socket per open store, poked after every append
      # Small files are replaced atomically: write a temp file, fsync, rename, fsync the directory.
      class Directory
        attr_reader :path, :writable

        def initialize(path)
          @path = File.expand_path(path)
          @writable = prepare
        end

        def join(*parts) = File.join(@path, *parts)

        def segment_ids
          Dir.children(@path).filter_map { |f| Segment.first_id(f) }.sort
        end

        # The write lock's file, or nil for a directory this process may only read.
        def open_lock
          File.new(join("LOCK"), File::RDWR | File::CREAT, 0o644)
        rescue Errno::EACCES, Errno::EROFS, Errno::EPERM
          nil
        end

        # Held shared by writers waiting for LOCK (WriteLease); nil when it cannot be opened.
        def open_waiters
          File.new(join("WAITERS"), File::RDONLY | File::CREAT, 0o644)
        rescue SystemCallError
          nil
        end

        # The contents of META, STATE or IDS; nil when the file does not exist.
        def read_json(name) = Directory.read_json(join(name))

        # What each JSON side file must hold. Anything else (empty, cut short, garbage, wrong types) is damage.
        SHAPES = {
          "META" => ->(d) { d["format"] == 1 && d["epoch"].is_a?(String) && !d["epoch"].empty? && count?(d["segment_bytes"], 1) },
          "STATE" => ->(d) { count?(d["last_global_id"]) && d["channels"].is_a?(Hash) && d["channels"].all? { |k, v| channel?(k, v) } },
          "IDS" => ->(d) { count?(d["reserved"]) && count?(d["floor"]) }
        }.freeze

        # Parses a side file and checks its shape; raises CorruptStoreError naming the file when it is damaged.
        def self.read_json(path)
          content = File.binread(path)
          data = begin
            JSON.parse(content.dup.force_encoding(Encoding::UTF_8))
          rescue JSON::ParserError, EncodingError
            raise CorruptStoreError.new("#{path} is damaged (#{content.empty? ? "empty" : "not JSON: #{preview(content)}"})", file: path)
          end
          return data if data.is_a?(Hash) && SHAPES.fetch(File.basename(path)).call(data)
          raise CorruptStoreError.new("#{path} is damaged (unexpected contents: #{preview(content)})", file: path)
        rescue Errno::ENOENT
          nil
        end

        def self.preview(content) = (content.bytesize > 60) ? "#{content.byteslice(0, 60).b.inspect}..." : content.b.inspect

        def self.count?(value, min = 0) = value.is_a?(Integer) && value >= min

        # A STATE channel entry: "key" => [last id, max_backlog_size or nil, max_backlog_age or nil].
        def self.channel?(key, value)
          key.is_a?(String) && value.is_a?(Array) && value.size == 3 && count?(value[0]) &&
            (value[1].nil? || count?(value[1], 1)) && (value[2].nil? || (value[2].is_a?(Numeric) && value[2] > 0))
        end

        def write_atomically(name, content)
          target = join(name)
          tmp = "#{target}.#{Process.pid}.#{Thread.current.object_id}.tmp"
          File.open(tmp, "wb") do |f|
            f.write(content)
            f.fsync
          end
          File.rename(tmp, target)
          fsync_dir(File.dirname(target))
        rescue SystemCallError
          FileUtils.rm_f(tmp) # a full disk leaves no half-written temp file behind
          raise
        end

        def fsync_dir(dir = @path)
          File.open(dir, File::RDONLY) { |d| d.fsync }
        end

        def delete(file)
          File.unlink(join(file))
        rescue Errno::ENOENT
          nil # another process deleted it first
        end

        # Cursor and lease names become file names: anything but [A-Za-z0-9_.-] is %-escaped.
        def self.escape(name)
          name.to_s.b.gsub(/[^A-Za-z0-9_.-]/n) { |c| format("%%%02X", c.ord) }
        end

        private

        # Several processes open the same directory at once: mkdir_p tolerates the races.
        def prepare
          FileUtils.mkdir_p(@path)
          %w[cursors leases wakeup].each { |d| FileUtils.mkdir_p(join(d)) }
          File.writable?(@path)
        rescue Errno::EACCES, Errno::EROFS, Errno::EPERM
          raise unless File.directory?(@path)
          false
        end
      end
    end
  end
end
