# frozen_string_literal: true

require_relative "rack_helper"

# GET {base}message-bus/herald.js serves the browser client built from js/ (the gem ships the file);
# any other verb on that path is still a poll, as it is for message_bus.
class ClientScriptTest < Minitest::Test
  include Herald::RackHelpers

  def test_serves_the_built_client_with_an_etag
    m = mock(middleware(base_route: "/sub"))
    response = m.get("/sub/message-bus/herald.js")
    assert_equal 200, response.status
    assert_equal "text/javascript; charset=utf-8", response.headers["content-type"]
    assert_equal File.binread(Herald::Rack::ClientScript::PATH), response.body
    assert_includes response.body, "MessageBus"
    etag = response.headers["etag"]
    assert_match(/\A"\h{32}"\z/, etag)
    again = m.get("/sub/message-bus/herald.js", "HTTP_IF_NONE_MATCH" => etag)
    assert_equal [304, ""], [again.status, again.body]
    head = m.request("HEAD", "/sub/message-bus/herald.js")
    assert_equal [200, ""], [head.status, head.body]
    assert_equal "the app", m.get("/message-bus/herald.js").body
  end

  def test_only_get_and_head_and_only_that_exact_path
    m = mock
    @bus.publish("/chat", "a")
    response = m.post("/message-bus/herald.js/poll?dlp=t", :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE)
    assert_equal ["a"], ids(JSON.parse(response.body))
    response = m.post("/message-bus/herald.js?dlp=t", :input => JSON.generate("/chat" => 0), "CONTENT_TYPE" => JSON_TYPE)
    assert_equal ["a"], ids(JSON.parse(response.body))
  end
end
