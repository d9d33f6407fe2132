# frozen_string_literal: true

# Checks of the drop-in's API that message_bus's specs leave out; run in a child process by
# test/message_bus_compat_test.rb (it defines MessageBus). Raises on the first difference.
require "herald/message_bus"
require "rack"
require "rack/mock"
require "json"

def check(what, expected, actual)
  raise "#{what}: expected #{expected.inspect}, got #{actual.inspect}" unless expected == actual
end

def wait_until
  deadline = Time.now + 5
  sleep 0.01 until yield || Time.now > deadline
end

MessageBus.configure(backend: :memory)
MessageBus.user_id_lookup { |env| env["HTTP_X_USER"]&.to_i }
got = []
blk = MessageBus.subscribe("/c") { |m| got << m.data }
check "subscribe returns the block", Proc, blk.class
MessageBus.publish("/c", "one")
wait_until { got.size == 1 }
MessageBus.unsubscribe("/c", &blk)
MessageBus.publish("/c", "two")
sleep 0.3
check "unsubscribe stops delivery", ["one"], got
check "last_ids", {"/c" => 2, "/none" => 0}, MessageBus.last_ids("/c", "/none")

# "global_id|message_id|channel|data", a | in a channel written $$123$$, non-ASCII data kept.
msg = MessageBus::Message.new(7, 3, "/a|b", "héllo|😀")
check "encode", "7|3|/a$$123$$b|héllo|😀", msg.encode
back = MessageBus::Message.decode(msg.encode)
check "decode", [7, 3, "/a|b", "héllo|😀"], back.to_a

# The middleware answers message_bus's poll with the module's lookups: a message for user 5 reaches user 5 only.
MessageBus.publish("/private", "secret", user_ids: [5])
app = MessageBus::Rack::Middleware.new(->(_env) { [404, {}, ["app"]] })
poll = ->(user) do
  env = Rack::MockRequest.env_for("/message-bus/abc/poll?dlp=t", :method => "POST", :params => {"/private" => "0"}, "HTTP_X_USER" => user.to_s)
  _status, _headers, body = app.call(env)
  text = +""
  body.each { |part| text << part }
  JSON.parse(text).map { |m| m["data"] }
end
check "user 5 gets its message", ["secret"], poll.call(5)
check "user 6 does not (a status reply instead)", false, poll.call(6).include?("secret")

# MessageBus::Client over the same bus: the data users send (accents, emoji, NUL, the stream separator, 1 MB)
# comes out of its backlog and its chunked stream byte for byte; a user-targeted message only to its user.
big = "é😀\u0000\r\n|\r\n" + ("x" * 1_000_000)
MessageBus.publish("/ünï", big)
MessageBus.publish("/ünï", "für 5", user_ids: [5])
client = MessageBus::Client.new(client_id: "c1", user_id: 6, message_bus: MessageBus)
client.subscribe("/ünï", 0)
check "client backlog", [big, {"/ünï" => 2}], client.backlog.map(&:data)
reader, writer = IO.pipe
client.use_chunked = true
client.io = writer
read = Thread.new { reader.read }
client << MessageBus.backlog("/ünï", 0).first
client.close
stream = read.value.force_encoding(Encoding::UTF_8)
payload = stream.split("\r\n\r\n", 2).last[/\A\h+\r\n(.*?)\r\n\|\r\n\r\n/m, 1]
check "chunked bytes", big, JSON.parse(payload.gsub("\r\n||\r\n", "\r\n|\r\n")).first["data"]
check "stream ends with [] then the terminator", true, stream.end_with?("[]\r\n|\r\n\r\n0\r\n\r\n")
MessageBus.destroy

# The configuration an app writes for message_bus, through the middleware: on_connect/on_disconnect around each
# poll with the site of site_id_lookup, group_ids_lookup targeting, extra_response_headers_lookup, the debug
# broadcast route (off by default outside Rails, on when allowed) carrying non-ASCII data, is_admin_lookup kept.
bus = MessageBus::Instance.new
bus.configure(backend: :memory)
site = "sité-😀"
hooks = []
bus.site_id_lookup { |env = nil| env ? env["HTTP_X_SITE"]&.then { |s| s.dup.force_encoding(Encoding::UTF_8) } : nil }
bus.group_ids_lookup { |env| [env["HTTP_X_GROUP"].to_i] }
bus.extra_response_headers_lookup { |_env| {"access-control-allow-origin" => "https://app.example"} }
bus.is_admin_lookup { |_env| true }
bus.on_connect { |site_id| hooks << [:connect, site_id] }
bus.on_disconnect { |site_id| hooks << [:disconnect, site_id] }
bus.publish("/g", "für Gruppe 7 ✓", group_ids: [7], site_id: site)
mw = MessageBus::Rack::Middleware.new(->(_env) { [404, {}, ["app"]] }, message_bus: bus)
request = ->(path, group, params = {}) do
  env = Rack::MockRequest.env_for(path, :method => "POST", :params => params, "HTTP_X_GROUP" => group.to_s, "HTTP_X_SITE" => site.b)
  status, headers, body = mw.call(env)
  text = +""
  body.each { |part| text << part }
  [status, headers, text.force_encoding(Encoding::UTF_8)]
end
_, headers, text = request.call("/message-bus/abc/poll?dlp=t", 7, "/g" => "0")
check "group 7 gets its message on its site", ["für Gruppe 7 ✓"], JSON.parse(text).map { |m| m["data"] }
check "extra response headers", "https://app.example", headers["access-control-allow-origin"]
check "on_connect then on_disconnect, with the site", [[:connect, site], [:disconnect, site]], hooks
_, _, text = request.call("/message-bus/abc/poll?dlp=t", 8, "/g" => "0")
check "group 8 gets a status instead", false, text.include?("Gruppe")
check "the app's own paths run no hooks", 404, request.call("/other", 7).first.tap { hooks.clear }
check "no hooks outside message-bus", [], hooks
check "broadcast is off by default", false, request.call("/message-bus/broadcast", 7, "channel" => "/b", "data" => "x").last == "sent"
bus.allow_broadcast = true
sent = "héllo 😀 #{"z" * 100_000}"
_, _, text = request.call("/message-bus/broadcast", 7, "channel" => "/b", "data" => sent)
got = bus.backlog("/b").map(&:data)
check "broadcast publishes", ["sent", [true]], [text[0, 100], got.map { |d| d == sent }]
check "a broadcast over 4 MiB is refused, not cut", 413, request.call("/message-bus/broadcast", 7, "channel" => "/b", "data" => "é" * 3_000_000).first
check "is_admin_lookup kept", true, bus.is_admin_lookup.call({})
bus.destroy

# Nothing configured: Herald's own default bus, on the embedded log ($HERALD_DIR); destroy leaves it to Herald.
require "tmpdir"
Dir.mktmpdir do |dir|
  ENV["HERALD_DIR"] = dir
  bus = MessageBus::Instance.new
  bus.publish("/d", "ünïcode")
  check "the default bus", [true, Herald::Store::Log], [bus.herald_bus.equal?(Herald.bus), Herald.bus.store.class]
  bus.destroy
  check "Herald's bus outlives destroy", ["ünïcode"], Herald.backlog("/d").map(&:data)
  Herald.reset!
end
puts "api ok"
