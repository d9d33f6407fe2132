# frozen_string_literal: true

require "test_helper"
require "open3"

# herald_subscribe renders <herald-subscription> with escaped attributes. In a child Ruby: ActionView's
# core extensions would change this suite's process.
class RailsHelperTest < Minitest::Test
  CHILD = <<~RUBY
    require "uri"
    require "action_view"
    require "herald/rails/helper"
    view = ActionView::Base.empty.extend(Herald::Rails::Helper)
    puts view.herald_subscribe("/chat/é 🎉 <x>")
    puts view.herald_subscribe("/rooms/1", turbo_stream: true, last_id: 0, id: "sub")
    puts view.herald_subscribe("/x").html_safe?
  RUBY

  def test_herald_subscribe_renders_the_element
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", CHILD)
    assert status.success?, err
    assert_equal [%(<herald-subscription channel="/chat/é 🎉 &lt;x&gt;"></herald-subscription>),
      %(<herald-subscription id="sub" channel="/rooms/1" turbo-stream="" last-id="0"></herald-subscription>), "true"],
      out.force_encoding(Encoding::UTF_8).lines(chomp: true)
  end
end
