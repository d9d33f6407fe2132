# frozen_string_literal: true

# A small Rails app written for message_bus (its initializer's lookups, MessageBus.publish in a controller and
# from a runner process), with `require "herald/message_bus"` in place of the message_bus gem. Run by
# test/message_bus_compat_test.rb in a child Ruby with the Rails gems of the Rails app test
# (vendor/rails-gems); ARGV[0] is the app's root. `publish` as ARGV[1]: the runner's part, a second process.
require "rails"
require "action_controller/railtie"
require "herald/message_bus"
require "rack/mock"
require "json"

def check(what, expected, actual)
  raise "#{what}: expected #{expected.inspect}, got #{actual.inspect}" unless expected == actual
end

class ChatApp < Rails::Application
  config.root = ARGV[0]
  config.eager_load = false
  config.secret_key_base = "x" * 64
  config.hosts.clear
  config.logger = Logger.new(File.join(ARGV[0], "rails.log"))
  config.session_store :cookie_store, key: "_chat"
end

# config/initializers/message_bus.rb, as written for message_bus.
MessageBus.user_id_lookup { |env| env["HTTP_X_USER"]&.to_i }

class MessagesController < ActionController::Base
  def create
    MessageBus.publish("/chat", {"text" => params[:text]}, user_ids: params[:to] && [params[:to].to_i])
    head :created
  end
end

ChatApp.initialize!
ChatApp.routes.draw { post "/messages" => "messages#create" }

if ARGV[1] == "publish" # bin/rails runner 'MessageBus.publish(...)'
  MessageBus.publish("/chat", {"text" => ARGV[2]})
  puts "published"
  exit
end

stack = ChatApp.middleware.map(&:klass)
check "MessageBus::Rack::Middleware right before ActionDispatch::Flash", ActionDispatch::Flash,
  stack[stack.index(MessageBus::Rack::Middleware) + 1]
check "behind the session", true, stack.index(ActionDispatch::Session::CookieStore) < stack.index(MessageBus::Rack::Middleware)
check "no second server of message-bus/", false, stack.include?(Herald::Rack::Middleware)
check "Rails' logger", Rails.logger, MessageBus.logger
check "Herald's store for the environment", File.join(ARGV[0], "storage", "herald", "development"), Herald.bus.store.dir

def poll(user, positions)
  env = Rack::MockRequest.env_for("/message-bus/#{"a" * 32}/poll?dlp=t", :method => "POST", :params => positions, "HTTP_X_USER" => user.to_s)
  status, headers, body = ChatApp.call(env)
  text = +""
  body.each { |part| text << part }
  [status, headers["content-type"], JSON.parse(text.force_encoding(Encoding::UTF_8))]
end

text = "héllo 👋 #{"ü" * 50_000}"
post = Rack::MockRequest.env_for("/messages", method: "POST", params: {"text" => text, "to" => "5"})
check "the controller published", 201, ChatApp.call(post).first
check "user 5 gets it", [200, "application/json; charset=utf-8", [text]], poll(5, "/chat" => "0").then { |s, t, msgs| [s, t, msgs.map { |m| m["data"]["text"] }] }
check "user 6 gets a status instead", [{"/chat" => 1}], poll(6, "/chat" => "0").last.map { |m| m["data"] }

# The runner, another process, publishes on the same store; this process's poll sees it.
runner = IO.popen([RbConfig.ruby, __FILE__, ARGV[0], "publish", "from the runner ✓"], &:read)
check "runner", "published\n", runner
check "the runner's message reaches the poll", ["from the runner ✓"], poll(6, "/chat" => "1").last.map { |m| m["data"]["text"] }
puts "rails ok"
