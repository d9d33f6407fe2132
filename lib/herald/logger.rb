# frozen_string_literal: true

require "logger"

module Herald
  # Where Herald reports what it noticed (damaged records, failed callbacks, transport errors).
  # Defaults to standard error at level INFO (`Herald.logger.level = :debug` adds e.g. every malformed request
  # `herald server` refused); set `Herald.logger = Rails.logger` (or any Logger) to send them elsewhere.
  class << self
    attr_writer :logger

    def logger
      @logger ||= ::Logger.new(CurrentStderr, level: :info, progname: "herald",
        formatter: proc { |sev, _, prog, msg| "[#{prog}] #{sev}: #{msg}\n" })
    end
  end

  # Writes to whatever $stderr is at the moment of writing (tests and daemons swap it), not at boot.
  module CurrentStderr
    def self.write(*chunks) = $stderr.write(*chunks)

    def self.close = nil
  end
end
