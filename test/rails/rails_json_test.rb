# frozen_string_literal: true

require "test_helper"
require "open3"
require "json"

# What Rails apps publish arrives as Rails encodes it: with ActiveSupport loaded and the JSON fallback the
# Railtie sets (Herald::Codec::Json.fallback = ActiveSupport::JSON), a client's poll returns, for each
# value Rails apps send (SafeBuffer, TimeWithZone, BigDecimal, objects with as_json, symbol keys, nested,
# non-ASCII, emoji), what `ActiveSupport::JSON.encode` of the same value reads as: what
# ActionCable.server.broadcast sends. In a child Ruby: ActiveSupport's core extensions would change JSON
# for the rest of this suite.
class RailsJsonTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)

  CHILD = <<~'RUBY'
    require "herald"
    require "active_support"
    require "active_support/json"
    require "active_support/time"
    require "active_support/core_ext/string/output_safety"
    require "active_support/hash_with_indifferent_access"
    require "bigdecimal"
    require "rack"
    require "rack/mock"
    Herald::Codec::Json.fallback = ActiveSupport::JSON # what the Railtie does

    Money = Struct.new(:cents, :currency) do
      def as_json(*) = {"amount" => format("%.2f", cents / 100.0), "currency" => currency}
    end
    class Signup # a model-like object: Rails encodes its instance variables (Object#as_json)
      def initialize = (@email = "josé@example.com") && (@tags = [:new, "🎉"])
    end
    Time.zone = "Tokyo"
    at = Time.zone.local(2024, 1, 2, 3, 4, 5.123456r)
    html = ActiveSupport::SafeBuffer.new("<p>héllo 日本語 🎉 & «quotes» \"</p>")
    values = {
      "safe_buffer" => {"html" => html},
      "safe_buffer_alone" => html + "<br>".html_safe,
      "time_with_zone" => {"at" => at, "utc" => Time.utc(2024, 5, 6, 7, 8, 9.5r), "date" => Date.new(2024, 2, 29)},
      "big_decimal" => {"price" => BigDecimal("12345678901234567890.123456789"), "small" => BigDecimal("0.1")},
      "as_json" => [Money.new(1999, "€"), Signup.new],
      "symbol_keys" => {text: "👩‍👩‍👧 ü", nested: {deeper: [{at: at, n: 1, f: 1.5, no: nil, yes: true}]}},
      "non_finite" => [Float::NAN, Float::INFINITY, 2.5],
      "indifferent" => ActiveSupport::HashWithIndifferentAccess.new("a" => html, :b => [1, "二"]),
      "plain" => {"text" => "plain 日本語 <tag> \u2028 \u0000"}
    }
    bus = Herald::Bus.new(store: Herald::Store::Memory.new)
    values.each { |name, value| bus.publish("/rails/#{name}", value) }
    mw = Herald::Rack::Middleware.new(->(_) { [404, {}, []] }, bus: bus)
    body = JSON.generate(values.keys.to_h { |name| ["/rails/#{name}", 0] })
    response = Rack::MockRequest.new(mw).post("/message-bus/rails-client/poll?dlp=t", input: body, "CONTENT_TYPE" => "application/json")
    received = JSON.parse(response.body).to_h { |m| [m["channel"].delete_prefix("/rails/"), m["data"]] }
    expected = values.transform_values { |v| JSON.parse(ActiveSupport::JSON.encode(v)) }
    puts JSON.generate({"status" => response.status, "received" => received, "expected" => expected})
    bus.close
  RUBY

  def test_a_client_receives_what_active_support_json_encodes
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", CHILD, chdir: ROOT)
    assert status.success?, "child failed: #{err}"
    result = JSON.parse(out)
    assert_equal 200, result["status"]
    expected = result["expected"]
    assert_equal 9, expected.size
    expected.each { |name, value| assert_equal value, result["received"][name], name }
    # The figures Rails gives, spelt out (so an ActiveSupport that changed them is noticed too).
    assert_equal "2024-01-02T03:04:05.123+09:00", expected["time_with_zone"]["at"]
    assert_equal "12345678901234567890.123456789", expected["big_decimal"]["price"]
    assert_equal %(<p>héllo 日本語 🎉 & «quotes» "</p><br>), expected["safe_buffer_alone"]
    assert_equal [{"amount" => "19.99", "currency" => "€"}, {"email" => "josé@example.com", "tags" => ["new", "🎉"]}], expected["as_json"]
    assert_equal [nil, nil, 2.5], expected["non_finite"]
  end
end
