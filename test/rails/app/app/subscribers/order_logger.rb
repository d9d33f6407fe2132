# frozen_string_literal: true

# A deferred subscriber: each event once across every Puma worker. The first attempt at event 3 fails, so
# Herald logs a retry (through Rails.logger) before handling it.
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
    Rails.root.join("log", "handled.txt").open("a") { |f| f.puts "#{Process.pid} #{message.global_id} #{event["n"]} #{event["text"]}" }
  end
end
