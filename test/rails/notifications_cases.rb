# frozen_string_literal: true

# The *.herald instrumentation events of publishing, polling and delivering, and of handler calls. Shared by
# test/rails/notifications_test.rb, which runs them twice: in the suite's process through Herald's own
# callbacks (ActiveSupport not loaded), and in a child Ruby through real ActiveSupport::Notifications:
#
#   HERALD_WITH_AS=1 bundle exec ruby -Itest test/rails/notifications_cases.rb
if $PROGRAM_NAME == __FILE__ && ENV["HERALD_WITH_AS"] == "1"
  require "active_support"
  require "active_support/notifications"
end
require_relative "../events/events_helper"
require_relative "../rack/rack_helper"

module Herald
  module NotificationsCases
    include RackHelpers
    include EventsTestSupport

    # Looks like the ids the JS client makes; must appear in no payload.
    SECRET = "s3cr3tClientId-9f8e7d6c5b4a"
    DATA = {"text" => "héllo 👋 日本語", "nul" => "a\u0000b", "empty" => ""}.freeze

    def setup
      super # EventsTestSupport's (RackHelpers' setup is called below: both define one)
      @bus = Herald::Bus.new(store: Herald::Store::Memory.new)
      @middlewares = []
      @servers = []
      @seen = Queue.new
      @listener = listen { |name, payload, duration| @seen << [name, payload.dup, duration] }
    end

    def teardown
      unlisten(@listener)
      @servers.each(&:stop)
      @middlewares.each(&:close)
      @bus.close
      super
    end

    # Every event seen so far named `name`, [[payload, duration]]; waits up to 5 s for `count` of them.
    def events(name, count: nil)
      @got ||= []
      deadline = monotonic + 5
      loop do
        @got << @seen.pop until @seen.empty?
        found = @got.select { |e| e[0] == name }.map { |e| e.drop(1) }
        return found if count.nil? || found.size >= count || monotonic > deadline
        sleep 0.01
      end
    end

    def event(name) = events(name, count: 1).last&.first

    def assert_no_client_id
      @got ||= []
      @got << @seen.pop until @seen.empty?
      refute_empty @got
      @got.each { |name, payload, _| refute_includes payload.inspect, SECRET, "#{name} carries the client id" }
      # The test's own check could miss an encoding: the id must not be anywhere in the values either.
      @got.each { |name, payload, _| payload.each_value { |v| refute_equal SECRET, v.to_s, name } }
    end

    def test_publish_reports_channel_ids_and_bytes_never_targets
      id = @bus.publish("/chat", DATA, client_ids: [SECRET], user_ids: [7])
      payload, duration = events("publish_message.herald", count: 1).last
      msg = @bus.backlog("/chat").last
      assert_equal id, msg.message_id
      assert_equal({channel: "/chat", site_id: nil, bytes: JSON.generate(DATA).bytesize, targeted: true,
                    message_id: msg.message_id, global_id: msg.global_id}, payload.slice(:channel, :site_id, :bytes, :targeted, :message_id, :global_id))
      assert_operator duration, :>=, 0
      msg2 = @bus.publish_message("/news", "plain", site_id: "eu")
      payload, = events("publish_message.herald", count: 2).last
      assert_equal ["/news", "eu", 7, false, msg2.global_id], payload.values_at(:channel, :site_id, :bytes, :targeted, :global_id)
      assert_no_client_id
    end

    def test_the_facade_publish_is_reported
      use_store(Herald::Store::Memory.new)
      Herald.publish("/f", [1, "ü"])
      assert_equal ["/f", 1], event("publish_message.herald").values_at(:channel, :global_id)
    end

    def test_a_publish_that_fails_validation_reports_nothing
      assert_raises(Herald::InvalidMessageError) { @bus.publish("", "x") }
      assert_raises(Herald::InvalidMessageError) { @bus.publish("/x", "x", client_ids: [nil]) }
      assert_empty events("publish_message.herald")
    end

    def test_short_poll_reply
      @bus.publish("/chat", DATA, client_ids: [SECRET])
      @bus.publish("/chat", "for another client", client_ids: ["other"])
      response = poll(mock, {"/chat" => 0, "/news" => -1}, client: SECRET, query: "dlp=t")
      assert_equal 200, response.status
      payload, duration = events("poll.herald", count: 1).last
      # Two channels; one message for this client (the other's is withheld) plus the status entry.
      assert_equal({channels: 2, mode: :short_poll, status: 200, messages: 1, parked: false},
        payload.slice(:channels, :mode, :status, :messages, :parked))
      assert_operator duration, :>=, 0
      assert_no_client_id
    end

    def test_long_poll_parked_then_delivered
      mw = middleware
      m = mock(mw)
      waiting = in_thread { poll(m, {"/chat" => 0}, client: SECRET, HTTP_DONT_CHUNK: "t") }
      parked(mw)
      assert_equal({channels: 1, mode: :long_poll, status: 200, messages: 0, parked: true},
        event("poll.herald").slice(:channels, :mode, :status, :messages, :parked))
      @bus.publish("/chat", DATA)
      assert_equal [DATA], JSON.parse(waiting.value.body).map { |x| x["data"] }
      assert_equal({mode: :long_poll, encoding: :json, messages: 1}, event("deliver.herald"))
      assert_no_client_id
    end

    def test_chunked_stream_and_sse_deliveries
      mw = middleware
      m = mock(mw)
      stream = in_thread { poll(m, {"/chat" => 0}, client: SECRET) }
      sse = in_thread { m.get("/message-bus/#{SECRET}x/sse?%2Fchat=0", "HTTP_ACCEPT" => "application/vnd.msgpack") }
      parked(mw, 2)
      modes = events("poll.herald", count: 2).map { |p, _| p.values_at(:mode, :status, :parked) }.sort
      assert_equal [[:chunked, 200, true], [:sse, 200, true]], modes
      @bus.publish("/chat", DATA)
      delivered = events("deliver.herald", count: 2).map { |p, _| p.values_at(:mode, :encoding, :messages) }.sort
      assert_equal [[:chunked, :json, 1], [:sse, :json, 1]], delivered
      assert_includes stream.value.body.b, "👋".b
      assert_includes sse.value.body.b, "👋".b
      assert_no_client_id
    end

    def test_refused_and_bad_polls_report_their_status
      mw = middleware(max_active_clients: 0)
      assert_equal 429, poll(mock(mw), {"/chat" => 0}, client: SECRET, HTTP_DONT_CHUNK: "t").status
      assert_equal 400, poll(mock(mw), "%ZZ=1", client: SECRET).status
      assert_equal 413, poll(mock(middleware(max_body_bytes: 8)), {"/a-long-channel" => 0}, client: SECRET).status
      got = events("poll.herald", count: 3).map(&:first)
      assert_equal [429, 400, 413], got.map { |p| p[:status] }
      assert_equal [nil, nil, nil], got.map { |p| p[:exception] }, "a client's bad request is no exception of ours"
      assert_no_client_id
    end

    def test_a_hijacked_long_poll_under_puma
      server = puma
      socket = server.request({"/chat" => 0}, client: SECRET, version: "HTTP/1.0")
      eventually { @middlewares.last.active_clients == 1 }
      @bus.publish("/chat", DATA)
      assert_equal [DATA], JSON.parse(PumaServer.read(socket).last).map { |x| x["data"] }
      assert_equal [:long_poll, 200, true], event("poll.herald").values_at(:mode, :status, :parked)
      assert_equal 1, event("deliver.herald")[:messages]
      assert_no_client_id
    ensure
      socket&.close
    end

    def test_sync_and_deferred_handler_calls
      use_store(log_store)
      define_subscriber("SyncAudit", "/orders") { |_, _| nil }
      define_subscriber("MailLater", "/orders", deferred: true) { |_, _| nil }
      Herald.start_workers
      Herald.publish_event({"n" => "ü"}, channel: "/orders")
      calls = events("process.herald", count: 2).map { |p, d| [p[:subscriber], p[:deferred], p[:attempt], d >= 0] }
      assert_equal [["MailLater", true, 1, true], ["SyncAudit", false, 1, true]], calls.sort_by(&:first)
      published = event("publish.herald")
      assert_equal ["/orders", {"n" => "ü"}], [published[:channel], published[:message].data]
    end
  end
end

# In the child: the same cases through real ActiveSupport::Notifications.
if $PROGRAM_NAME == __FILE__
  class ActiveSupportNotificationsTest < Minitest::Test
    include Herald::NotificationsCases

    def listen(&block)
      raise "ActiveSupport::Notifications is not loaded (HERALD_WITH_AS=1)" unless defined?(ActiveSupport::Notifications)
      ActiveSupport::Notifications.subscribe(/\.herald\z/) do |event|
        block.call(event.name, event.payload, event.duration / 1000.0)
      end
    end

    def unlisten(subscriber) = ActiveSupport::Notifications.unsubscribe(subscriber)
  end
end
