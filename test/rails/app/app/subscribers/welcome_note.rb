# frozen_string_literal: true

# A deferred subscriber the generated app's own test (test/herald_inline_test.rb) runs inline with
# Herald::TestHelper#perform_published_events.
class WelcomeNote
  include Herald::Subscriber

  subscribe_to "/signups"
  deferred

  def call(event, _message) = Rails.root.join("log", "welcome-#{Rails.env}.txt").open("a") { |f| f.puts event["email"] }
end
