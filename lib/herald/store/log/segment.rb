# frozen_string_literal: true

module Herald
  module Store
    class Log
      # One append-only segment file, named by the first global id it holds. It knows how far it has been
      # read and verified (`size`): everything before is whole records (or reported damage), everything
      # after is either new records from another process or damage at the tail.
      class Segment
        NAME = /\A(\d{20})\.log\z/

        def self.file_name(first_id) = format("%020d.log", first_id)

        def self.first_id(file_name) = (m = NAME.match(file_name)) && Integer(m[1], 10)

        attr_reader :path, :first_id, :size

        def initialize(dir, first_id, writable:, create: false)
          @first_id = first_id
          @path = File.join(dir, Segment.file_name(first_id))
          flags = writable ? File::RDWR : File::RDONLY
          flags |= File::CREAT | File::EXCL if create
          @io = File.new(@path, flags | File::BINARY, 0o644)
          @size = 0
          @offset = 0 # where the descriptor's file offset is (Segment#write); nil: unknown
        end

        # The same file through a descriptor of our own (after fork), read up to where it was; false when
        # the file is gone (deleted by retention in another process: nothing in it was retained).
        def reopen(writable:)
          @io = File.new(@path, (writable ? File::RDWR : File::RDONLY) | File::BINARY)
          @offset = 0
          true
        rescue Errno::ENOENT
          false
        end

        # True when the file holds bytes not read yet (appended by another process, or damage).
        def unread? = @io.size > @size

        def file_size = @io.size

        # Reads what was appended since the last call, yielding (buffer, pos, length, file offset) for each
        # whole record.
        # A damaged stretch followed by a good record is skipped and reported to `on_corrupt(offset)`; a
        # damaged or partial stretch at the end is left unread (a writer may still be writing it; under the
        # write lock the caller cuts it with truncate_tail!). Returns true when it read to the end.
        def read_new(on_corrupt:)
          limit = @io.size
          return true if @size >= limit
          buffer = @io.pread(limit - @size, @size)
          pos = scan(buffer, @size, buffer.bytesize, on_corrupt) { |b, p, l| yield b, p, l, @size + p }
          @size += pos
          pos == buffer.bytesize
        rescue EOFError
          true # a writer cut a torn tail between our size check and the read
        end

        # Cuts damage at the tail (a record torn by a crash, garbage) so the next append lands right after
        # the last good record; made durable before anything is appended after it.
        def truncate_tail!
          cut = @io.size - @size
          return 0 if cut <= 0
          @io.truncate(@size)
          @io.fdatasync
          cut
        end

        # Writes one whole frame at the end, straight to the OS (no Ruby buffer). When the write fails half
        # way (disk full, file-size limit) the file is cut back so no half record is left behind.
        #
        # write_nonblock, not pwrite: Ruby's pwrite (and write, syswrite) hands the GVL to other threads for
        # the syscall and queues for it again after. With several threads publishing, every record cost its
        # writer a sleep and a wakeup and the others a round trip through the store's lock; even one
        # publishing thread beside the store's own (wakeup listener, fsync) took 0.3-0.7 context switches a
        # record. write_nonblock calls write(2) keeping the GVL (a regular file never refuses it for EAGAIN),
        # at the cost of one fcntl more. It writes at the descriptor's offset, so that offset is kept at
        # `size`, set by a seek whenever the end moved otherwise (others' records read, a failed write).
        def write(frame)
          @io.sysseek(@size) unless @offset == @size
          @offset = nil # until the whole frame is in
          written = @io.write_nonblock(frame, exception: false) # (write_keeping_gvl, inline: every append)
          written = @io.syswrite(frame) if written == :wait_writable
          written += write_keeping_gvl(frame.byteslice(written..)) while written < frame.bytesize
          @size += written
          @offset = @size
        rescue SystemCallError
          begin
            @io.truncate(@size)
          rescue SystemCallError
            nil # a read-only file system refuses this too; readers stop at the partial tail
          end
          raise
        end

        def sync = @io.fdatasync

        def close = @io.close

        def closed? = @io.closed?

        private

        def write_keeping_gvl(bytes)
          n = @io.write_nonblock(bytes, exception: false)
          (n == :wait_writable) ? @io.syswrite(bytes) : n # not for a regular file; blocking is right if it were
        end

        # Whole records from pos on; returns where the records stopped (buffer end, or the start of tail damage).
        def scan(buffer, base, limit, on_corrupt)
          pos = 0
          while pos < limit
            length = Record.check(buffer, pos, limit)
            if length.is_a?(Integer)
              yield buffer, pos, length
              pos += Record::FRAME_SIZE + length
            else
              good = resync(buffer, pos + 1, limit) or return pos
              on_corrupt.call(base + pos)
              pos = good
            end
          end
          pos
        end

        # The next offset holding a whole record with a good CRC, or nil.
        def resync(buffer, from, limit)
          (from..limit - Record::FRAME_SIZE - Record::HEADER_SIZE).each do |pos|
            return pos if Record.check(buffer, pos, limit).is_a?(Integer)
          end
          nil
        end
      end
    end
  end
end
