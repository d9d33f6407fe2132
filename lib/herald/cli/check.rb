# frozen_string_literal: true

module Herald
  module CLI
    # herald check DIR: verifies every record of a log; exit status 1 when any record is corrupt.
    class Check < Command
      REPAIR = {
        "META" => "opening the log fails until it is restored from a backup or deleted (a new epoch)",
        "STATE" => "rebuilt from the segments when the log is next opened",
        "IDS" => "rebuilt when the log is next opened; ids restart well above the log's end"
      }.freeze

      def run
        no_more_than!(1)
        report = Store::Log::Checker.new(arg!(0, "DIR")).run
        report.corrupt.each { |path, offset| @out.puts "corrupt record: #{path} at byte offset #{offset}" }
        report.torn.each do |path, offset, bytes|
          @out.puts "torn tail: #{path} at byte offset #{offset} (#{bytes} bytes; cut when the log is next opened)"
        end
        report.damaged.each { |e| @out.puts "damaged file: #{e.message} (#{REPAIR.fetch(File.basename(e.file))})" }
        damaged = ", #{report.damaged.size} damaged side file#{"s" if report.damaged.size > 1}" if report.damaged.any?
        @out.puts "#{report.segments} segments, #{report.records} good records, #{report.corrupt.size} corrupt#{damaged}"
        report.ok? ? 0 : 1
      end
    end
    register "check", Check, "check DIR", "verify every record of a log; exit 1 if any is corrupt"
  end
end
