# frozen_string_literal: true

require "zlib"

module Herald
  module Store
    class Log
      # Durable readers' state in the log directory: cursors (small files replaced atomically) and leases
      # (flocks, freed by the kernel when their process dies).
      #
      # cursors/NAME holds "<global id> <CRC32 of the id's digits, 8 hex digits>\n", and cursors/NAME~
      # the version it replaced. A damaged file (empty, torn, garbage: a disk, a copy or a hand gone
      # wrong) is never read as 0, which would run every retained event again: the previous version is
      # used instead (the events after it run again, which at-least-once allows), and with no good
      # previous version load_cursor raises CorruptCursorError. "~" never appears in an escaped name.
      module Cursors
        CURSOR = /\A(\d{1,19}) ([0-9a-f]{8})\n\z/
        BARE_CURSOR = /\A(\d{1,19})\n?\z/ # written by Herald before cursors had a checksum; also what a person writes
        PREVIOUS = "~"

        def load_cursor(name, default: 0)
          path = cursor_path(name)
          content = read_cursor(path) or return default
          id = parse_cursor(content) and return id
          previous = read_cursor(path + PREVIOUS)
          id = previous && parse_cursor(previous) or raise damaged_cursor(name, path, content)
          Herald.logger.warn "cursor #{path} is damaged (#{describe_cursor(content)}): #{name} resumes from its " \
            "previous version #{id}; the events it handled after that run again"
          id
        end

        def save_cursor(name, global_id)
          Store.validate_cursor!(global_id)
          writable!
          digits = global_id.to_s
          storing do
            keep_previous_cursor(cursor_path(name))
            @directory.write_atomically(File.join("cursors", Directory.escape(name)), format("%s %08x\n", digits, Zlib.crc32(digits)))
          end
        end

        # An flock on leases/NAME: the kernel frees it when the owner's process dies. A new owner reads what
        # the previous one stored (its last dead letter, say) before it goes on: the index catches up with
        # the segments now, not when the previous owner's wakeup is handled.
        def lease(name)
          file = storing { File.new(@directory.join("leases", Directory.escape(name)), File::RDWR | File::CREAT, 0o644) }
          unless file.flock(File::LOCK_EX | File::LOCK_NB)
            file.close
            return nil
          end
          begin
            refresh
            name_holder(file)
          rescue Exception # standard:disable Lint/RescueException
            file.close # never held without having read
            raise
          end
          Lease.new { file.close }
        end

        # "host:pid" of the process holding `name`'s lease, nil when nobody holds it: the holder writes
        # itself into the flock'ed file; a file nobody locks is a stale name.
        def lease_holder(name)
          path = @directory.join("leases", Directory.escape(name))
          File.open(path, File::RDONLY) do |file|
            if file.flock(File::LOCK_SH | File::LOCK_NB)
              file.flock(File::LOCK_UN)
              return nil
            end
            holder = file.read(256).to_s.strip
            holder.empty? ? "unknown" : holder.force_encoding(Encoding::UTF_8).scrub
          end
        rescue Errno::ENOENT
          nil
        end

        private

        # Best effort: a read-only directory still leases, it just cannot say who holds it.
        def name_holder(file)
          file.truncate(0)
          file.pwrite(Store.lease_holder_id, 0)
        rescue SystemCallError, IOError
          nil
        end

        def cursor_path(name) = @directory.join("cursors", Directory.escape(name))

        def read_cursor(path)
          File.binread(path)
        rescue Errno::ENOENT
          nil
        end

        def parse_cursor(content)
          if (m = CURSOR.match(content))
            Integer(m[1], 10) if format("%08x", Zlib.crc32(m[1])) == m[2]
          elsif (m = BARE_CURSOR.match(content))
            Integer(m[1], 10)
          end
        end

        # The file about to be replaced becomes NAME~, if it is good: a hard link (no data copied, and
        # the directory fsync of the write that follows makes both durable), renamed into place.
        def keep_previous_cursor(path)
          content = read_cursor(path)
          return unless content && parse_cursor(content)
          tmp = "#{path}#{PREVIOUS}.#{Process.pid}.#{Thread.current.object_id}.tmp"
          begin
            File.link(path, tmp)
          rescue Errno::EEXIST
            File.unlink(tmp)
            retry
          rescue Errno::EPERM, Errno::ENOTSUP, Errno::EOPNOTSUPP, Errno::EXDEV
            File.open(tmp, "wb") { |f| f.write(content) && f.fsync } # a file system without hard links
          end
          File.rename(tmp, path + PREVIOUS)
        end

        def damaged_cursor(name, path, content)
          CorruptCursorError.new("cursor #{path} is damaged (#{describe_cursor(content)}) and has no good previous " \
            "version: write the last global id it is done with into it (e.g. `echo 1234 > #{path}`), or delete " \
            "it to start afresh, as a new subscriber does", name: name)
        end

        def describe_cursor(content) = content.empty? ? "empty" : "#{content.bytesize} bytes: #{content[0, 24].inspect}"
      end
    end
  end
end
