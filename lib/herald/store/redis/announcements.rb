# frozen_string_literal: true

module Herald
  module Store
    class Redis
      # The records the server's wakeups carried (Scripts::APPEND publishes a record of up to
      # Scripts::ANNOUNCE_MAX bytes with its wakeup), kept in a run of consecutive global ids, so that a
      # reader woken by them takes the new records from here instead of reading them back: one round trip
      # less between a publish in one process and its delivery in another.
      #
      # Only a run that is gapless from the reader's cursor up to the latest id the listener announced
      # answers (`after` returns nil otherwise: the reader reads the server): a wakeup without a record (a
      # large record, a batch, a reset's keyless wakeup), a lost connection, or ids that jump break the run,
      # and a record that came through a wakeup is the server's own, stored in the same script. The run keeps
      # at most MAX_RECORDS records and MAX_BYTES bytes, dropping the oldest.
      class Announcements
        MAX_RECORDS = 1024
        MAX_BYTES = 4 << 20

        def initialize
          @lock = Mutex.new
          reset_run
        end

        def add(global_id, record)
          @lock.synchronize do
            reset_run if @first && global_id != @first + @records.size
            @first ||= global_id
            @records << record
            @bytes += record.bytesize
            drop_oldest while @records.size > MAX_RECORDS || (@bytes > MAX_BYTES && @records.size > 1)
          end
        end

        # A wakeup without a record, or one the listener may have missed: the run ends here.
        def clear
          @lock.synchronize { reset_run }
        end

        # The records with global ids after `last_id` (at most `limit`), when the run holds every id from
        # last_id + 1 up to `upto` (the latest id announced); else nil.
        def after(last_id, upto, limit)
          @lock.synchronize do
            return nil if @first.nil? || upto <= last_id || @first > last_id + 1 || @first + @records.size - 1 < upto
            from = last_id + 1 - @first
            @records[from, limit || @records.size]
          end
        end

        private

        def reset_run
          @records = []
          @first = nil
          @bytes = 0
          nil
        end

        def drop_oldest
          @bytes -= @records.shift.bytesize
          @first += 1
        end
      end
    end
  end
end
