# frozen_string_literal: true

module Herald
  module Events
    # SIGTERM (and any other signal given) -> Herald.shutdown(timeout:), then the signal's previous
    # behaviour (by default the process terminates, running at_exit hooks).
    #
    #   Herald::Events::Signals.install(timeout: 25)
    #
    # A trap handler may not take locks, so the shutdown runs on a thread of its own.
    module Signals
      def self.install(timeout: 25, signals: %w[TERM])
        signals.each do |sig|
          previous = nil
          previous = trap(sig) do
            Thread.new do
              Herald.shutdown(timeout: timeout)
              trap(sig, previous || "DEFAULT")
              Process.kill(sig, Process.pid)
            end
          end
        end
      end
    end
  end
end
