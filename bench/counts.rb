# frozen_string_literal: true

# Per-operation costs that hold on a loaded machine (unlike wall-clock rates): objects allocated per op
# (GC.stat) for the hot paths, and, when asked, the same loop for an outside counter:
#
#   bundle exec ruby bench/counts.rb                      # objects/op of every case
#   bundle exec ruby bench/counts.rb poll 2000            # run one case N times (no output), for:
#   strace -f -c -o out.txt bundle exec ruby bench/counts.rb publish 2000   # syscalls (diff against N=0)
#   valgrind --tool=callgrind --callgrind-out-file=/dev/null bundle exec ruby bench/counts.rb poll 2000
#
# Cases: publish (Log :interval), backlog (Log backlog of 10 + last_ids), poll (a dlp=t poll of two channels
# through Herald's middleware, Rack env, no server: 10 messages and a status), poll10 (the HTTP bench's poll:
# one channel, the same 10 messages every time: answered from the middleware's reply cache), poll10-built (the
# same with the reply cache off: every reply built), form (decoding a 3-channel poll form).
require_relative "harness"
require "herald"
require "stringio"
require "tmpdir"

DATA = {"hello" => "world", "nums" => [1, 2, 3]}.freeze
BODY = "%2Fbench%2Fpoll=0&%2Fnews=-1&__seq=7"

def poll_env(body = BODY)
  {"REQUEST_METHOD" => "POST", "PATH_INFO" => "/message-bus/0123456789abcdef/poll", "QUERY_STRING" => "dlp=t",
   "SERVER_PROTOCOL" => "HTTP/1.1", "CONTENT_TYPE" => "application/x-www-form-urlencoded", "HTTP_DONT_CHUNK" => "true",
   "rack.input" => StringIO.new(body.dup), "SCRIPT_NAME" => "", "SERVER_NAME" => "127.0.0.1", "SERVER_PORT" => "80",
   "rack.url_scheme" => "http"}
end

def cases(dir)
  log = Herald::Bus.new(store: Herald::Store::Log.new(dir: File.join(dir, "log"), fsync: :interval))
  10.times { |i| log.publish("/bench/poll", {"n" => i, "text" => "message #{i}"}) }
  app = Herald::Rack::Middleware.new(->(_env) { [404, {}, []] }, bus: log)
  uncached = Herald::Rack::Middleware.new(->(_env) { [404, {}, []] }, bus: log, reply_cache: false)
  env = poll_env
  same = poll_env("%2Fbench%2Fpoll=0")
  built = poll_env("%2Fbench%2Fpoll=0")
  {
    "publish" => -> { log.publish("/test/channel", DATA) },
    "backlog" => -> { log.last_ids("/bench/poll", "/news") && log.backlog("/bench/poll", 0) },
    "poll" => lambda {
      env["rack.input"].rewind
      _, _, body = app.call(env)
      body.close if body.respond_to?(:close)
    },
    "poll10" => lambda {
      same["rack.input"].rewind
      _, _, body = app.call(same)
      body.close if body.respond_to?(:close)
    },
    "poll10-built" => lambda {
      built["rack.input"].rewind
      _, _, body = uncached.call(built)
      body.close if body.respond_to?(:close)
    },
    "form" => -> { Herald::Rack::PollRequest.decode_form(BODY) }
  }
end

Dir.mktmpdir("herald-counts") do |dir|
  all = cases(dir)
  if (name = ARGV[0])
    run = all.fetch(name)
    run.call # warm
    Integer(ARGV[1] || "1000").times { run.call }
  else
    all.each do |name, run|
      100.times { run.call }
      GC.start
      before = GC.stat(:total_allocated_objects)
      n = 2000
      n.times { run.call }
      puts format("%-8s %6.1f objects/op", name, (GC.stat(:total_allocated_objects) - before).fdiv(n))
    end
  end
end
