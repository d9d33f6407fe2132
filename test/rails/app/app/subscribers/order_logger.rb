# frozen_string_literal: true

# A deferred subscriber: each event once across every Puma worker. The first attempt at event 3 fails, so
# Herald logs a retry (through Rails.logger) before handling it. An event with "sleep" is slow: its start goes
# to log/started.txt, so the test can stop Puma while a handler is in flight.
class OrderLogger
  include Herald::Subscriber

  subscribe_to "/orders"
  deferred
  retry_on StandardError, attempts: 3, wait: 0.05

  def call(event, message)
    marker = Rails.root.join("tmp", "failed-once")
    if event["n"] == 3 && !marker.exist?
      marker.write("x")
      raise "first attempt fails (ü)"
    end
    if event["sleep"]
      record("started.txt", "#{Process.pid} #{message.global_id} #{event["n"]}")
      sleep event["sleep"]
    end
    record("handled.txt", "#{Process.pid} #{message.global_id} #{event["n"]} #{event["text"]}")
  end

  private

  def record(file, line) = Rails.root.join("log", file).open("a") { |f| f.puts line }
end
