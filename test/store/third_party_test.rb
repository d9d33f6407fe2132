# frozen_string_literal: true

require_relative "../test_helper"
require "rack/mock"
require "timeout"

# A store that is none of Herald's classes plugs in through the contract alone: from_url by a registered
# scheme, the bus, and the HTTP middleware (its reactor, reply cache and responder ask capabilities, never
# the class). Here: the contract's methods forwarded to a Memory store, under another class.
class ThirdPartyStoreTest < Minitest::Test
  class ForwardingStore
    CONTRACT = %i[append last_id last_ids last_global_id peek_last_global_id backlog global_backlog epoch
      known_epoch wait load_cursor save_cursor lease lease_holder retention stats close local_reads? watch].freeze
    include Herald::Store::Controls # pause/resume on its own cursors (Events::Worker and the dashboard use them)

    CONTRACT.each { |name| define_method(name) { |*args, **options, &block| @inner.public_send(name, *args, **options, &block) } }

    def initialize(url:, local: true)
      @url = url
      @inner = Herald::Store::Memory.new
      @local = local
    end

    attr_reader :url

    def local_reads? = @local

    def watch(&block) = @local ? @inner.watch(&block) : nil
  end

  def test_from_url_builds_a_registered_scheme
    Herald::Store.register_url("thirdparty://", %r{\Athirdparty://}i) { |url, **options| ForwardingStore.new(url: url, **options) }
    store = Herald::Store.from_url("thirdparty://host/x")
    assert_instance_of ForwardingStore, store
    assert_equal "thirdparty://host/x", store.url
    error = assert_raises(Herald::InvalidArgumentError) { Herald::Store.from_url("nosuch://x") }
    assert_match(%r{thirdparty://}, error.message, "the registered scheme is named among the choices")
  end

  def test_the_bus_and_the_middleware_serve_it_with_and_without_callbacks
    [true, false].each do |local|
      bus = Herald::Bus.new(store: ForwardingStore.new(url: "x", local: local))
      got = Queue.new
      bus.subscribe("/tp") { |msg| got << msg.data }
      bus.publish("/tp", "héllo ✓")
      assert_equal "héllo ✓", Timeout.timeout(5) { got.pop }, "local_reads? #{local}: a bus subscription gets it"
      app = Herald::Rack::Middleware.new(->(_env) { [404, {}, ["app"]] }, bus: bus)
      2.times do # the second one may come from the reply cache
        body = ::Rack::MockRequest.new(app).post("/message-bus/c#{local}/poll?dlp=t", input: "/tp=0").body
        assert_equal ["héllo ✓"], JSON.parse(body).map { |m| m["data"] }
      end
      app.close
      bus.close
    end
  end
end
