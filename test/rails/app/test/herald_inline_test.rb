# frozen_string_literal: true

require "test_helper"
require "herald/test_helper"

# Run by test/rails/rails_app_test.rb inside the generated app (`bin/rails test test/herald_inline_test.rb`).
class HeraldInlineTest < ActiveSupport::TestCase
  include Herald::TestHelper

  NOTES = Rails.root.join("log", "welcome-test.txt")

  setup { NOTES.delete if NOTES.exist? }

  test "deferred subscribers run only when asked, inline" do
    Herald.publish_event({"email" => "early@example.com"}, channel: "/signups")
    sleep 0.3
    assert_not NOTES.exist?, "a deferred subscriber ran by itself in a test"
    perform_published_events { Herald.publish_event({"email" => "josé@例え.jp 🎉"}, channel: "/signups") }
    assert_equal ["josé@例え.jp 🎉"], NOTES.readlines(chomp: true)
    perform_published_events
    assert_equal ["josé@例え.jp 🎉", "early@example.com"], NOTES.readlines(chomp: true)
  end

  test "what Rails renders is published as its text" do
    html = ApplicationController.render(inline: "<b><%= name %></b>", locals: {name: "é & 日本"})
    assert_kind_of ActiveSupport::SafeBuffer, html
    assert_published("/chat", {"html" => "<b>é &amp; 日本</b>"}) { Herald.publish("/chat", {"html" => html}) }
  end
end
