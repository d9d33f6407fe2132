# frozen_string_literal: true

module Herald
  module Store
    class Log
      # Durable readers' state in the log directory: cursors (small files replaced atomically) and leases
      # (flocks, freed by the kernel when their process dies).
      module Cursors
        def load_cursor(name)
          Integer(File.read(@directory.join("cursors", Directory.escape(name))), 10)
        rescue Errno::ENOENT
          0
        end

        def save_cursor(name, global_id)
          writable!
          storing { @directory.write_atomically(File.join("cursors", Directory.escape(name)), global_id.to_s) }
        end

        # An flock on leases/NAME: the kernel frees it when the owner's process dies.
        def lease(name)
          file = storing { File.new(@directory.join("leases", Directory.escape(name)), File::RDWR | File::CREAT, 0o644) }
          return Lease.new { file.close } if file.flock(File::LOCK_EX | File::LOCK_NB)
          file.close
          nil
        end
      end
    end
  end
end
