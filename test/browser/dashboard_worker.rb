# frozen_string_literal: true

# Real data for the dashboard's browser test, from another process on the server's log directory: a
# deferred subscriber (Mailer) handling /orders with a handler that fails on every fifth order (dead
# letters with real errors and backtraces), and messages on channels whose names and payloads need escaping. Prints "ready" once the dead letters are in, then
# keeps its workers (and their leases) until SIGTERM.
#   bundle exec ruby test/browser/dashboard_worker.rb DIR
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "herald"

class DeliveryFailed < StandardError; end

class Mailer
  include Herald::Subscriber

  subscribe_to "/orders"
  deferred start: :oldest
  retry_on DeliveryFailed, attempts: 2, wait: 0.01

  def call(event, _message)
    raise DeliveryFailed, "SMTP 451 for <#{event["email"]}>" if (event["n"] % 5).zero?
  end
end

dir = ARGV.fetch(0)
Herald.configure { |c| c.store = Herald::Store::Log.new(dir: dir) }
store = Herald.bus.store
30.times { |n| Herald.publish("/orders", {"n" => n, "email" => "user#{n}@example.com", "total" => n * 9.5}) }
Herald.publish("/chat <script>alert(1)</script>", {"text" => "<img src=x onerror=alert(1)> 日本語 🎉"})
Herald.start_workers
dead = Herald::Events::DeadLetters.new(store)
sleep 0.05 until dead.pending("Mailer").size >= 6
$stdout.puts "ready"
$stdout.flush
stop = Queue.new
trap(:TERM) { stop << true }
stop.pop
Herald.shutdown(timeout: 5)
