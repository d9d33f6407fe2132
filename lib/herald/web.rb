# frozen_string_literal: true

require "json"
require "uri"
require "openssl"
require "securerandom"
require "time"
require "set"
require_relative "web/html"
require_relative "web/request"
require_relative "web/csrf"
require_relative "web/subscriber_status"
require_relative "web/subscribers_page"
require_relative "web/dead_letters_page"
require_relative "web/channels_page"
require_relative "web/store_page"
require_relative "web/metrics" # <mount>/metrics
require_relative "web/health"  # <mount>/health

module Herald
  # The dashboard, a Rack app with no build step:
  #
  #   mount Herald::Web => "/herald"          # config/routes.rb, inside the app's own authentication
  #   map("/herald") { run Herald::Web }      # config.ru, any Rack app
  #
  #   Herald::Web.use Rack::Auth::Basic do |user, password| ... end   # middleware in front of it
  #   Herald::Web.read_only = true            # every POST answers 403; pages still show
  #   Herald::Web.secret = ENV["SECRET_KEY_BASE"] # signs the CSRF cookie (else a plain double-submit cookie)
  #   Herald::Web.message_bus_path = "/"      # where Herald::Rack::Middleware answers (the live tail)
  #   Herald::Web.subscribers = ["Mailer"]    # subscribers whose workers run in processes without their classes
  #
  # Beside the pages: <mount>/metrics (Herald::Web::Metrics, Prometheus text) and <mount>/health
  # (Herald::Web::Health, 200 or 503); both are Rack apps of their own too, for a scraper or a probe that
  # must not go through the dashboard's authentication.
  #
  # Pages: subscribers (cursor, lag, lease holder; pause, resume, move the cursor), dead letters (retry,
  # delete, singly and filtered), channels (browse, live tail, publish), store. Every action is a POST
  # carrying the CSRF token, answered by a redirect to the page with a notice. Operator actions go
  # through the store (Store::Controls), so the workers of every process obey them.
  class Web
    ROUTES = {
      ["GET", "/subscribers"] => [SubscribersPage, :show],
      ["POST", "/subscribers/pause"] => [SubscribersPage, :pause],
      ["POST", "/subscribers/resume"] => [SubscribersPage, :resume],
      ["POST", "/subscribers/reset"] => [SubscribersPage, :reset],
      ["GET", "/dead"] => [DeadLettersPage, :show],
      ["POST", "/dead/retry"] => [DeadLettersPage, :retry],
      ["POST", "/dead/delete"] => [DeadLettersPage, :delete],
      ["GET", "/channels"] => [ChannelsPage, :index],
      ["GET", "/channel"] => [ChannelsPage, :show],
      ["POST", "/channel/publish"] => [ChannelsPage, :publish],
      ["GET", "/store"] => [StorePage, :show]
    }.freeze
    CLIENT_JS = File.expand_path("rack/herald.js", __dir__)

    class << self
      attr_accessor :read_only, :secret, :message_bus_path
      # Keywords of Herald::Web::Health for <mount>/health (disk_free_min:, lag_max:, lag_seconds_max:, ...).
      attr_accessor :health_options
      # Names of deferred subscribers whose classes this process does not load (their workers run elsewhere).
      attr_accessor :subscribers
      attr_writer :bus

      # The bus the dashboard looks at: Herald's default one unless set.
      def bus = @bus || Herald.bus

      # Rack middleware in front of the dashboard (authentication): as Rack::Builder#use.
      def use(middleware, *args, &block)
        @middlewares << [middleware, args, block]
        @app = nil
      end

      def middlewares = @middlewares.dup

      def call(env) = (@app ||= build).call(env)

      # Back to the defaults (tests).
      def reset!
        @middlewares = []
        @app = nil
        @bus = nil
        @read_only = false
        @secret = nil
        @message_bus_path = "/"
        @health_options = {}
        @subscribers = []
      end

      private

      def build
        @middlewares.reverse.inject(new) { |app, (middleware, args, block)| middleware.new(app, *args, &block) }
      end
    end
    reset!

    # Instances are configured by keywords; what is not given is read from the class's settings per request.
    def initialize(bus: nil, read_only: nil, secret: nil, message_bus_path: nil)
      @bus = bus
      @read_only = read_only
      @secret = secret
      @message_bus_path = message_bus_path
    end

    def bus = @bus || self.class.bus

    def read_only? = @read_only.nil? ? !!self.class.read_only : @read_only

    def message_bus_path = @message_bus_path || self.class.message_bus_path || "/"

    def call(env)
      req = Request.new(env)
      csrf = Csrf.new(req, secret: @secret || self.class.secret)
      return asset(req) if req.path == "/herald.js"
      # Lag for the subscribers this process loads and those named in Web.subscribers (workers elsewhere).
      return Metrics.new(bus: bus, subscribers: Events::Lag.names | self.class.subscribers.map(&:to_s)).call(env) if req.path == "/metrics"
      return Health.new(bus: bus, **(self.class.health_options || {})).call(env) if req.path == "/health"
      return redirect(req, "/subscribers") if req.path == "" || req.path == "/"
      page, action = ROUTES[[req.get? ? "GET" : req.request_method, req.path]]
      return not_found(req, csrf) unless page
      if req.post?
        return refuse(req, csrf, 403, "read-only mode: this dashboard shows, it does not act") if read_only?
        return refuse(req, csrf, 403, "the form's CSRF token is missing or stale: reload the page and try again") unless csrf.valid?
      end
      csrf.set_cookie(page.new(self, req, csrf).public_send(action))
    rescue BusyError => e
      refuse(req, csrf, 409, e.message)
    rescue InvalidArgumentError, SubscriberError => e
      refuse(req, csrf, 422, e.message)
    end

    def redirect(req, path, notice: nil)
      query = notice ? "?#{URI.encode_www_form("notice" => notice)}" : ""
      query = "#{path.include?("?") ? "&" : "?"}#{query.delete_prefix("?")}" unless query.empty?
      [303, {"location" => "#{req.script_name}#{path}#{query}", "content-type" => "text/plain"}, []]
    end

    private

    def asset(req)
      [200, {"content-type" => "text/javascript; charset=utf-8", "cache-control" => "public, max-age=300"}, [File.binread(CLIENT_JS)]]
    end

    def not_found(req, csrf) = refuse(req, csrf, 404, "no such page: #{req.path}")

    def refuse(req, csrf, status, reason)
      html = Html.new(req, csrf, read_only: read_only?)
      [status, Html::HEADERS.dup, [html.layout("Herald", "") { "<p class=\"error\">#{Html.h(reason)}</p>" }]]
    end
  end
end
