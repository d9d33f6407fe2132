# frozen_string_literal: true

# Which process confirmed each ActionCable subscription, one line each in log/cable.txt: the app test opens
# Turbo pages until both Puma workers hold one.
ActiveSupport::Notifications.subscribe("transmit_subscription_confirmation.action_cable") do |event|
  File.open(Rails.root.join("log", "cable.txt"), "a") { |f| f.puts "#{Process.pid} #{event.payload[:channel_class]}" }
end
