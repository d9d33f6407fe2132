# frozen_string_literal: true

module Herald
  module Store
    class Log
      # Verifies every record of a log directory without changing anything (no recovery, no lock taken):
      # what `herald check DIR` prints.
      class Checker
        Report = Struct.new(:segments, :records, :corrupt, :torn, :damaged) do
          def ok? = corrupt.empty? && damaged.empty?
        end

        SIDE_FILES = %w[META STATE IDS].freeze

        def initialize(dir)
          @dir = dir.to_s
          raise ArgumentError, "#{@dir} is not a directory" unless File.directory?(@dir)
        end

        # corrupt: [[segment path, offset]] of records skipped for a bad CRC, a broken frame or an id out of order;
        # torn: [[segment path, offset, bytes]] of damage at a segment's end (cut on the next open);
        # damaged: [CorruptStoreError] for each side file (META, STATE, IDS) that is not what it should be.
        def run
          report = Report.new(0, 0, [], [], side_files)
          last = 0
          segment_ids.each do |id|
            segment = Segment.new(@dir, id, writable: false)
            report.segments += 1
            clean = segment.read_new(on_corrupt: ->(offset) { report.corrupt << [segment.path, offset] }) do |buffer, pos, _, offset|
              global_id = buffer.unpack1("Q<", offset: pos + Record::FRAME_SIZE)
              next report.corrupt << [segment.path, offset] if global_id <= last # duplicated or misplaced
              last = global_id
              report.records += 1
            end
            report.torn << [segment.path, segment.size, segment.file_size - segment.size] unless clean
          ensure
            segment&.close
          end
          report
        end

        private

        # Damaged side files, and missing ones the log needs: STATE once segments were deleted, IDS once
        # records were written (what opening the log would warn about and rebuild).
        def side_files
          ids = segment_ids
          SIDE_FILES.filter_map do |name|
            path = File.join(@dir, name)
            next if Directory.read_json(path) || ids.empty?
            missing = "#{path} is missing" if (name == "STATE" && ids.first > 1) || (name == "IDS" && records?(ids))
            CorruptStoreError.new(missing, file: path) if missing
          rescue CorruptStoreError => e
            e
          end
        end

        def records?(ids) = ids.any? { |id| File.size(File.join(@dir, Segment.file_name(id))) > 0 }

        def segment_ids = Dir.children(@dir).filter_map { |f| Segment.first_id(f) }.sort
      end
    end
  end
end
