# frozen_string_literal: true

require_relative "rack_helper"
require "logger"
require "stringio"
require "message_bus"

# The same requests to message_bus 4.5.1's own middleware (unmodified, memory backend) and to Herald's,
# compared (issue 10, section 2). Runs on Rack 3 (bin/test) and Rack 2.2 (bin/test-rack2).
class MessageBusParityTest < Minitest::Test
  include Herald::RackHelpers

  def setup
    super
    @mb = MessageBus::Instance.new
    @mb.configure(backend: :memory)
    @mb.logger = Logger.new(nil)
    @mb.long_polling_interval = 500 # ms
    @mb_middlewares = []
  end

  def teardown
    super
    @mb_middlewares.each(&:stop_listener)
    @mb.destroy
  end

  def mb_middleware(app = APP)
    MessageBus::Rack::Middleware.new(app, message_bus: @mb).tap { |mw| @mb_middlewares << mw }
  end

  # [status, parsed JSON body or raw body] from each: {herald: ..., message_bus: ...}
  def both(path, body, type: FORM_TYPE, herald: middleware, message_bus: mb_middleware)
    {herald: herald, message_bus: message_bus}.transform_values do |app|
      response = ::Rack::MockRequest.new(::Rack::Lint.new(app)).post(path, :input => body, "CONTENT_TYPE" => type)
      [response.status, parse(response.body)]
    end
  end

  def parse(body)
    JSON.parse(body)
  rescue JSON::ParserError
    body
  end

  def assert_same_reply(expected, replies, label = nil)
    assert_equal expected, replies[:message_bus], "message_bus #{label}"
    assert_equal expected, replies[:herald], "herald #{label}"
  end

  def status_reply(data) = [200, [{"global_id" => -1, "message_id" => -1, "channel" => "/__status", "data" => data}]]

  def publish_both(channel, data)
    @mb.publish(channel, data)
    @bus.publish(channel, data)
  end

  # 1. A channel name without a leading slash is a channel.
  def test_a_channel_without_a_leading_slash_is_served_as_by_message_bus
    poll = "/message-bus/c1/poll?dlp=t"
    assert_same_reply status_reply("abc" => 0), both(poll, "abc=-1"), "form"
    assert_same_reply status_reply("abc" => 0), both(poll, JSON.generate("abc" => -1), type: JSON_TYPE), "JSON"
    publish_both("abc", "héllo 👋")
    publish_both("/abc", "with slash")
    message = {"global_id" => 1, "message_id" => 1, "channel" => "abc", "data" => "héllo 👋"}
    assert_same_reply [200, [message]], both(poll, "abc=0"), "backlog"
    assert_same_reply [200, [message]], both(poll, "abc=0&%2Fabc="), "two channels"
    assert_same_reply status_reply("chat room" => 0), both(poll, "chat+room=-1"), "space"
  end

  def test_channel_names_that_cannot_work_are_refused_with_a_clear_error
    ["=-1", "a%24%7C%24b=-1"].each do |body|
      response = poll(mock, body, query: "dlp=t")
      assert_equal 400, response.status, body
      assert_match(/channel names/, response.body)
    end
  end

  # 2. on_middleware_error: an exception in a lookup is mapped to a response by the app's hook.
  def test_on_middleware_error_maps_a_failing_lookup_to_a_response
    hook = ->(env, e) { [422, {"content-type" => "text/plain"}, ["#{env["PATH_INFO"]} #{e.class}: #{e.message}"]] }
    @mb.on_middleware_error(&hook)
    %i[user_id_lookup group_ids_lookup site_id_lookup extra_response_headers_lookup].each do |lookup|
      failing = ->(_env) { raise KeyError, "#{lookup} failed" }
      @mb.configure(lookup => failing)
      replies = both("/message-bus/c1/poll?dlp=t", "/chat=-1",
        herald: middleware(lookup => failing, :on_middleware_error => hook), message_bus: mb_middleware)
      assert_same_reply [422, "/message-bus/c1/poll KeyError: #{lookup} failed"], replies, lookup
      @mb.configure(lookup => nil)
    end
  end

  # Without the hook, or when it returns nil, both raise the error on to the app server; Herald logs it.
  def test_without_a_hook_the_error_is_raised_and_logged
    failing = ->(_env) { raise KeyError, "no user" }
    @mb.user_id_lookup(&failing)
    [nil, ->(_env, _e) {}].each do |hook|
      @mb.configure(on_middleware_error: hook)
      herald = middleware(user_id_lookup: failing, on_middleware_error: hook)
      [herald, mb_middleware].each do |app|
        log = capture_log do
          error = assert_raises(KeyError) { mock(app).post("/message-bus/c1/poll?dlp=t", input: "/chat=-1") }
          assert_equal "no user", error.message
        end
        assert_match(%r{ERROR: http transport: POST /message-bus/c1/poll failed: KeyError: no user}, log) if app == herald
      end
    end
  end

  def test_a_hook_that_raises_is_logged_too
    herald = middleware(user_id_lookup: ->(_env) { raise KeyError, "no user" }, on_middleware_error: ->(_env, e) { raise e })
    log = capture_log { assert_raises(KeyError) { mock(herald).post("/message-bus/c1/poll", input: "/chat=-1") } }
    assert_match(/KeyError: no user/, log)
  end

  # 3. base_route: leading and trailing slash added, repeated slashes squeezed.
  def test_base_route_is_normalised_as_by_message_bus
    ["//my///base/route", "my/route", "/my/route/", "", "a//b//"].each do |route|
      @mb.base_route = route
      apps = {herald: middleware(base_route: route), message_bus: mb_middleware}
      served = "/#{route}/message-bus/c1/poll?dlp=t".squeeze("/")
      [served, "/message-bus/c1/poll?dlp=t", "/#{route}message-bus/c1?dlp=t", "//#{route}/message-bus/c1?dlp=t"].uniq.each do |path|
        replies = both(path, "/chat=-1", **apps)
        assert_equal replies[:message_bus], replies[:herald], "base_route #{route.inspect}, #{path}"
      end
      assert_equal status_reply("/chat" => 0), both(served, "/chat=-1", **apps)[:herald], "base_route #{route.inspect}"
    end
  end

  # 5. Rails' default middleware order in front: Rack::MethodOverride reads a form body first.
  def test_behind_the_rails_middleware_stack_a_form_poll_is_read
    apps = {herald: rails_stack { |app| middleware_on(app) }, message_bus: rails_stack { |app| mb_middleware(app) }}
    assert_same_reply status_reply("/chat" => 0), both("/message-bus/c1/poll?dlp=t", "%2Fchat=-1", **apps)
    publish_both("/chat", "hi")
    message = {"global_id" => 1, "message_id" => 1, "channel" => "/chat", "data" => "hi"}
    assert_same_reply [200, [message]], both("/message-bus/c1/poll?dlp=t", "/chat=0&__seq=3", **apps)
    assert_same_reply [200, [message]], both("/message-bus/c1/poll?dlp=t", JSON.generate("/chat" => 0), type: JSON_TYPE, **apps)
    assert_equal "the app", mock(apps[:herald]).post("/other", input: "_method=put").body
  end

  # 6. A multipart/form-data poll (an HTML form or FormData posted as is): message_bus reads it through
  # Rack::Request#POST, so it works; directly and behind MethodOverride, which parses it first on Rack 3.
  def test_a_multipart_poll_is_read_as_message_bus_reads_it
    publish_both("/chat", "hi")
    message = {"global_id" => 1, "message_id" => 1, "channel" => "/chat", "data" => "hi"}
    body = multipart("/chat" => "0", "__seq" => "1")
    stacks = {
      "direct" => {},
      "behind the Rails stack" => {herald: rails_stack { |app| middleware_on(app) }, message_bus: rails_stack { |app| mb_middleware(app) }}
    }
    stacks.each do |label, apps|
      assert_same_reply [200, [message]], both("/message-bus/c1/poll?dlp=t", body, type: MULTIPART_TYPE, **apps), label
    end
  end

  # The same over a real socket (Puma's rack.input), long polling on: the backlog comes back at once.
  def test_behind_the_rails_middleware_stack_on_puma_a_form_poll_gets_its_backlog
    servers = {herald: puma(rails_stack { |app| middleware_on(app) }), message_bus: puma(rails_stack { |app| mb_middleware(app) })}
    publish_both("/chat", "hi")
    replies = servers.transform_values do |server|
      socket = server.request("%2Fchat=0", type: FORM_TYPE, headers: {"Dont-Chunk" => "true"})
      status, _headers, body = Herald::PumaServer.read(socket, timeout: 3)
      [status, JSON.parse(body)]
    end
    assert_same_reply [200, [{"global_id" => 1, "message_id" => 1, "channel" => "/chat", "data" => "hi"}]], replies
  end

  private

  MULTIPART_TYPE = "multipart/form-data; boundary=HeraldBoundary"

  def multipart(fields)
    parts = fields.map { |name, value| "--HeraldBoundary\r\nContent-Disposition: form-data; name=\"#{name}\"\r\n\r\n#{value}\r\n" }
    "#{parts.join}--HeraldBoundary--\r\n"
  end

  def middleware_on(app)
    Herald::Rack::Middleware.new(app, bus: @bus, long_polling_interval: 0.5).tap { |mw| @middlewares << mw }
  end

  # Rails 7.1's default middleware order, as far as rack alone provides it (ActionDispatch's own
  # middlewares are not in the bundle), with the bus where message_bus's railtie puts it: after the session.
  def rails_stack
    app = [::Rack::Head, ::Rack::ConditionalGet, ::Rack::ETag, ::Rack::TempfileReaper].reverse.inject(APP) { |a, mw| mw.new(a) }
    app = yield(app)
    app = rack_session.new(app, secret: "x" * 64) if rack_session
    [::Rack::Sendfile, ::Rack::Runtime, ::Rack::MethodOverride].reverse.inject(app) { |a, mw| mw.new(a) }
  end

  # Rack 2 ships its cookie session; on Rack 3 it moved to the rack-session gem (not in the bundle).
  def rack_session
    require "rack/session/cookie"
    ::Rack::Session::Cookie
  rescue LoadError
    nil
  end

  def capture_log
    out = StringIO.new
    previous = Herald.logger
    Herald.logger = Logger.new(out, formatter: proc { |sev, _, _, msg| "#{sev}: #{msg}\n" })
    yield
    out.string
  ensure
    Herald.logger = previous
  end
end
