# frozen_string_literal: true

# Every *.herald notification, one JSON line each in log/herald_notifications.txt (the server's and the runners'):
# the app test checks that ActiveSupport::Notifications saw the publishes, the polls and the deliveries.
ActiveSupport::Notifications.subscribe(/\.herald\z/) do |event|
  fields = event.payload.slice(:channel, :global_id, :bytes, :mode, :status, :messages, :parked, :subscriber)
  File.open(Rails.root.join("log", "herald_notifications.txt"), "a") do |f|
    f.puts JSON.generate({"pid" => Process.pid, "name" => event.name}.merge(fields))
  end
end
