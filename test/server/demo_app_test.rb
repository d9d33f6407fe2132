# frozen_string_literal: true

require "test_helper"
require "rack"
require "rack/lint"
require "rack/mock"
require "herald/server/demo_app"

# The demo page's Rack app alone (no HTTP server), through Rack::Lint.
class DemoAppTest < Minitest::Test
  def setup
    @bus = Herald::Bus.new(store: Herald::Store::Memory.new)
  end

  def teardown
    @bus.close
  end

  def test_serves_the_page_our_assets_and_message_bus_client_from_node_modules
    page = request.get("/")
    assert_equal 200, page.status
    assert_equal "text/html; charset=utf-8", page.content_type
    # The page loads Herald's client (served by the middleware in front, see test/rack/client_script_test.rb);
    # message_bus's client stays available for the tests and pages that compare the two.
    assert_includes page.body, %(<script src="/message-bus/herald.js">)
    refute_includes page.body, "/assets/message-bus.js"
    client = request.get("/assets/message-bus.js")
    assert_equal 200, client.status
    node_modules = File.expand_path("../../node_modules/message-bus-client/assets/message-bus.js", __dir__)
    assert_equal File.binread(node_modules), client.body
    %w[/assets/message-bus-ajax.js /assets/demo.js /assets/demo.css].each do |path|
      assert_equal 200, request.get(path).status, path
    end
  end

  def test_missing_client_package_says_to_run_npm_ci
    app = Herald::Server::DemoApp.new(bus: @bus, node_modules: Dir.mktmpdir)
    response = Rack::MockRequest.new(Rack::Lint.new(app)).get("/assets/message-bus.js")
    assert_equal 503, response.status
    assert_includes response.body, "npm ci"
  end

  def test_unknown_paths_and_methods_are_not_found
    assert_equal 404, request.get("/nope").status
    assert_equal 404, request.get("/../lib/herald.rb").status
    assert_equal 404, request.post("/elsewhere", input: "text=x").status
    assert_equal 404, request.delete("/chat").status
  end

  def test_form_post_publishes_to_chat
    response = post_form("name" => "ada", "text" => "  hello  ")
    assert_equal 201, response.status
    id = JSON.parse(response.body).fetch("message_id")
    message = @bus.backlog("/chat", 0).last
    assert_equal id, message.message_id
    assert_equal %w[hello ada], message.data.values_at("text", "name")
  end

  def test_json_post_publishes_and_defaults_the_name
    response = request.post("/chat", "CONTENT_TYPE" => "application/json", :input => JSON.generate("text" => "hi"))
    assert_equal 201, response.status
    assert_equal "anonymous", @bus.backlog("/chat", 0).last.data["name"]
  end

  def test_bad_posts_are_4xx_and_publish_nothing
    assert_equal 422, post_form("text" => " ").status
    assert_equal 413, post_form("text" => "x" * 2001).status
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => "application/json", :input => "[1]").status
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => "application/json", :input => "{").status
    assert_equal 0, @bus.last_id("/chat")
  end

  # What users type, sent as the page sends it (percent-escaped) and as `curl -d` sends it (raw bytes).
  def test_non_ascii_text_is_published_from_escaped_and_raw_forms_and_json
    text = "héllo 🎉 日本語 👨‍👩‍👧"
    assert_equal 201, post_form("name" => "zoë", "text" => text).status
    assert_equal 201, request.post("/chat", "CONTENT_TYPE" => FORM, :input => "name=zoë&text=#{text}".b).status
    assert_equal 201, request.post("/chat", "CONTENT_TYPE" => "application/json", :input => JSON.generate("name" => "zoë", "text" => text)).status
    assert_equal [[text, "zoë"]] * 3, @bus.backlog("/chat", 0).map { |m| m.data.values_at("text", "name") }
  end

  # The page's own form through the default store (the log): the bytes come back as sent.
  def test_non_ascii_text_through_the_log_store
    Dir.mktmpdir do |dir|
      bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir))
      app = Rack::MockRequest.new(Rack::Lint.new(Herald::Server::DemoApp.new(bus: bus)))
      response = app.post("/chat", "CONTENT_TYPE" => FORM, :input => URI.encode_www_form("text" => "héllo 🎉"))
      assert_equal 201, response.status, response.body
      assert_equal "héllo 🎉", bus.backlog("/chat", 0).last.data["text"]
    ensure
      bus&.close
    end
  end

  # The whole allowed length of 4-byte characters, percent-escaped (12 bytes each): all of it is published.
  def test_longest_text_of_emoji_is_published_whole
    assert_equal 201, post_form("text" => "🎉" * 2000).status
    assert_equal "🎉" * 2000, @bus.backlog("/chat", 0).last.data["text"]
    assert_equal 413, post_form("text" => "🎉" * 2001).status
    assert_equal 413, request.post("/chat", "CONTENT_TYPE" => FORM, :input => "text=#{"x" * 70_000}").status
  end

  # Only strings are published: never the #inspect of a Hash or an Array, nor "true" for true.
  def test_non_string_fields_are_refused
    [{"text" => {"a" => 1}}, {"text" => ["hi"]}, {"text" => 42}, {"text" => true}, {"text" => "hi", "name" => {"x" => 1}},
      {"text" => "hi", "name" => 7}].each do |fields|
      response = request.post("/chat", "CONTENT_TYPE" => "application/json", :input => JSON.generate(fields))
      assert_equal 400, response.status, fields.inspect
    end
    assert_equal 0, @bus.last_id("/chat")
    assert_equal 201, request.post("/chat", "CONTENT_TYPE" => "application/json", :input => '{"text":"hi","name":null}').status
    assert_equal "anonymous", @bus.backlog("/chat", 0).last.data["name"]
  end

  def test_bytes_that_are_not_utf8_are_refused
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => FORM, :input => "text=%FF%FE").status
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => FORM, :input => "text=\xFF".b).status
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => FORM, :input => "text=%zz").status
    assert_equal 400, request.post("/chat", "CONTENT_TYPE" => "application/json", :input => "{\"text\":\"\xFF\"}".b).status
    assert_equal 0, @bus.last_id("/chat")
  end

  private

  FORM = "application/x-www-form-urlencoded"

  def request = Rack::MockRequest.new(Rack::Lint.new(Herald::Server::DemoApp.new(bus: @bus)))

  def post_form(fields)
    request.post("/chat", "CONTENT_TYPE" => "application/x-www-form-urlencoded", :input => URI.encode_www_form(fields))
  end
end
