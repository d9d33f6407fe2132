# frozen_string_literal: true

require "test_helper"
require "stringio"
require "socket"
require "fileutils"
require "net/http"
require "json"
require "herald/cli"
require "herald/server"
require_relative "../support/herald_cli"

# The command line as a user meets it: the real exe/herald in a child process. A mistake is one line on
# standard error (plus the command's usage line when the call itself is malformed), never a backtrace.
class ServerCLITest < Minitest::Test
  include Herald::HeraldCLI

  def setup
    @tmp = Dir.mktmpdir("herald-cli")
    @file = File.join(@tmp, "a-file")
    File.write(@file, "")
    @dir = File.join(@tmp, "log")
  end

  def teardown
    FileUtils.chmod_R("u+rwx", @tmp)
    FileUtils.rm_rf(@tmp)
  end

  def test_usage_lists_the_server_command
    err = StringIO.new
    assert_equal 2, Herald::CLI.run([], out: StringIO.new, err: err)
    assert_includes err.string, "server [--port 9292] [--host 127.0.0.1] [--dir DIR]"
  end

  def test_help_goes_to_standard_output_with_status_0
    out, err, status = herald("--help")
    assert_equal 0, status.exitstatus
    assert_equal "", err
    assert_includes out, "tail CHANNEL [--from ID] [--site SITE] [--dir DIR]"
  end

  def test_bad_options_are_reported_with_status_2
    err = StringIO.new
    assert_equal 2, Herald::CLI.run(%w[server --port nine], out: StringIO.new, err: err)
    assert_match(/herald server: invalid argument: --port nine/, err.string)
    assert_equal 2, Herald::CLI.run(%w[server --bogus], out: StringIO.new, err: err)
  end

  def test_a_port_in_use_is_a_clear_error
    busy = TCPServer.new("127.0.0.1", 0)
    err = StringIO.new
    Dir.mktmpdir do |dir|
      status = Herald::CLI.run(["server", "--port", busy.addr[1].to_s, "--dir", dir], out: StringIO.new, err: err)
      assert_equal 1, status
      assert_match(/port #{busy.addr[1]} is in use/, err.string)
    end
  ensure
    busy&.close
  end

  # [arguments, environment, exit status, what the one line says]. Each of these was a backtrace, a
  # server that never answers, or a silently wrong result before.
  def bad_invocations
    busy = TCPServer.new("127.0.0.1", 0)
    @busy_port = busy.addr[1]
    @servers = [busy]
    [
      [%w[server --threads 0], {}, 2, /invalid argument: --threads 0 \(must be >= 1\)/],
      [%w[server --threads -3], {}, 2, /--threads -3 \(must be >= 1\)/],
      [%w[server --port -5], {}, 2, /invalid argument: --port -5 \(must be 0\.\.65535\)/],
      [%w[server --port 99999], {}, 2, /invalid argument: --port 99999 \(must be 0\.\.65535\)/],
      [%w[server --port nine], {}, 2, /invalid argument: --port nine/],
      [["server", "--port", @busy_port.to_s, "--dir", @dir], {}, 1, /port #{@busy_port} is in use/],
      [["server", "--host", "999.1.1.1", "--port", "0", "--dir", @dir], {}, 1, /cannot listen on 999\.1\.1\.1/],
      [["server", "--host", "", "--port", "0", "--dir", @dir], {}, 2, /host must name an address/],
      [%w[server --bogus], {}, 2, /invalid option: --bogus/],
      [%w[server extra], {}, 2, /unexpected argument "extra"/],
      [["server", "--port", "0", "--dir", @file], {}, 2, /--dir #{Regexp.escape(@file)}: .* is not a directory/],
      [["publish", "/chat", "{}", "--dir", File.join(@file, "sub")], {}, 2, /is not a directory/],
      [["publish", "/chat", "{}", "--dir", ""], {}, 2, /--dir is empty/],
      [["publish", "/chat", "{}"], {"HERALD_DIR" => ""}, 2, /HERALD_DIR is empty/],
      [["server", "--port", "0"], {"HERALD_DIR" => ""}, 2, /HERALD_DIR is empty/],
      [["publish", "/chat", "{}"], {"HERALD_DIR" => @file}, 2, /HERALD_DIR .* is not a directory/],
      [["publish", "/chat", "{}", "--dir", "/proc/1/herald"], {}, 1, %r{No such file or directory - /proc/1/herald}],
      [["publish", "/chat", '{"text": héllo}', "--dir", @dir], {}, 2, /JSON is not valid: .*héllo/],
      [["publish", "/chat", "", "--dir", @dir], {}, 2, /JSON is not valid/],
      [["publish", "/chat", "{\"text\":\"caf\xE9\"}".b, "--dir", @dir], {}, 2, /argument 3 is not valid UTF-8/],
      [["publish", "/chat"], {}, 2, /missing JSON/],
      [["publish", "/chat", "{}", "extra", "--dir", @dir], {}, 2, /unexpected argument "extra"/],
      [%w[tail], {}, 2, /missing CHANNEL/],
      [%w[tail /chat --from -1], {}, 2, /--from -1 \(must be >= 0\)/],
      [%w[check], {}, 2, /missing DIR/],
      [["check", @file], {}, 2, /is not a directory/],
      [%w[migrate], {}, 2, /no database: pass --url/],
      [%w[migrate --url postgres://127.0.0.1:1/herald], {}, 1, /PostgreSQL refused the migration: .*127\.0\.0\.1/],
      [%w[replay ChargeCard -r /missing.rb], {}, 2, %r{invalid argument: -r /missing\.rb \(no such file\)}],
      [["replay", "NoSuchSubscriber", "--dir", @dir], {}, 1, /no subscriber named NoSuchSubscriber/],
      [["dead", "--dir", @file], {}, 2, /is not a directory/],
      [["publish", "/chat", "{}"], {"HERALD_STORE" => "redis://127.0.0.1:1"}, 1, /Redis at redis:\/\/127\.0\.0\.1:1 is unreachable/],
      [["publish", "/chat", "{}"], {"HERALD_STORE" => "mongodb://x"}, 2, /Unknown store URL scheme: "mongodb:\/\/x"/],
      # An optional gem the app did not bundle: the message names the gem to add.
      [["publish", "/chat", "{}"], {"HERALD_STORE" => "redis://127.0.0.1:1", "RUBYOPT" => hide_gem("redis-client")}, 1,
        /needs the redis-client gem: add `gem "redis-client"` to your Gemfile/],
      [%w[migrate --url postgres://127.0.0.1:1/herald], {"RUBYOPT" => hide_gem("pg")}, 1, /needs the pg gem/]
    ]
  end

  def test_every_bad_invocation_is_one_line_and_an_exit_status
    cases = bad_invocations.each_with_index.map { |c, i| [*c, File.join(@tmp, "cwd-#{i}").tap { |d| Dir.mkdir(d) }] }
    results = cases.each_slice((cases.size + 3) / 4).map do |slice| # child processes, 4 at a time
      Thread.new { slice.map { |args, env, _, _, cwd| herald(*args, env: env, chdir: cwd) } }
    end.flat_map(&:value)
    problems = cases.zip(results).filter_map do |(args, env, status, message, cwd), (out, err, st)|
      wrong = invocation_problems(err.force_encoding(Encoding::UTF_8), out, st, status, message)
      wrong << "wrote into the current directory: #{Dir.children(cwd)}" if Dir.children(cwd).any?
      "herald #{args.join(" ")} #{env.inspect unless env.empty?}: #{wrong.join("; ")}\n#{err}" if wrong.any?
    end
    assert_empty problems, "#{problems.size} of #{cases.size} bad invocations:\n#{problems.join("\n")}"
  ensure
    @servers&.each(&:close)
  end

  def test_unknown_commands_print_the_usage
    _, err, status = herald("frob")
    assert_equal 2, status.exitstatus
    assert_equal %(herald: unknown command "frob"\n), err.lines.first
    assert_includes err, "Usage: herald COMMAND [options]"
    refute_match(/\.rb:\d+/, err)
  end

  # Before, --threads 0 listened, never answered and ignored SIGTERM; --port 99999 listened on 34463.
  def test_the_server_refuses_options_puma_would_misuse
    [{threads: 0}, {threads: "5"}, {port: 99_999}, {port: -5}, {port: "9292"}, {host: ""}, {host: nil}].each do |options|
      error = assert_raises(Herald::InvalidArgumentError, options.inspect) { Herald::Server.new(**options, dir: @dir) }
      assert_match(/must be an Integer|must name an address/, error.message)
      refute File.exist?(@dir), "#{options}: nothing is created before the options are checked"
    end
  end

  def test_port_0_picks_a_free_port_and_prints_it
    server = Herald::Server.new(port: 0, dir: @dir, log: (log = StringIO.new)).start
    assert_operator server.port, :>, 0
    assert_includes log.string, "Herald listening on http://127.0.0.1:#{server.port} "
  ensure
    server&.stop
    server&.wait
  end

  # Herald's own front end by default; --puma (front: :puma) puts Puma in front of the same middleware.
  def test_both_front_ends_serve_the_page_and_polls
    %i[herald puma].each do |front|
      server = Herald::Server.new(port: 0, dir: @dir, log: (log = StringIO.new), front: front).start
      assert_includes log.string, (front == :puma) ? "(Puma " : "(Herald's event loop"
      assert_equal "200", Net::HTTP.get_response(URI("#{server.url}/")).code
      server.bus.publish("/chat", "ünïcode ✓")
      reply = Net::HTTP.post(URI("#{server.url}/message-bus/#{front}/poll?dlp=t"), JSON.generate("/chat" => 0), "Content-Type" => "application/json")
      assert_equal "ünïcode ✓", JSON.parse(reply.body).first["data"], front
    ensure
      server&.stop
      server&.wait
    end
    assert_raises(Herald::InvalidArgumentError) { Herald::Server.new(front: :webrick, dir: @dir) }
    command = Herald::CLI::Server.allocate.tap { |c| c.instance_variable_set(:@options, {}) }
    command.send(:parser).parse!(%w[--puma])
    assert_equal({front: :puma}, command.instance_variable_get(:@options))
  end

  def test_an_ipv6_address_is_bracketed_in_the_url
    server = Herald::Server.new(host: "::1", port: 0, dir: @dir, log: (log = StringIO.new)).start
    assert_equal "http://[::1]:#{server.port}", server.url
    assert_includes log.string, "Herald listening on http://[::1]:#{server.port} "
    assert_equal "200", Net::HTTP.get_response(URI("#{server.url}/")).code
  rescue Herald::ConfigurationError => e
    skip "no IPv6 loopback on this machine: #{e.message}" # a container without ::1; says so, does not pass
  ensure
    server&.stop
    server&.wait
  end

  # Channel names without a leading slash are legal (as in message_bus), so `tail chat` tails "chat";
  # the demo and the README say "/chat", so a quiet "chat" gets a hint instead of silence forever.
  def test_tail_hints_at_the_slash_when_a_channel_without_one_is_empty
    tail = Tail.new("chat", "--dir", @dir)
    assert_equal %(note: channel "chat" is empty; did you mean "/chat"?), tail.err_gets
    herald_publish("/chat", '{"text":"on /chat"}', dir: @dir)
    assert_nil tail.gets(timeout: 0.5), "a message on /chat is not one on chat"
    status, err = tail.stop
    assert_equal 0, status.exitstatus
    assert_equal "", err, "one note"
  end

  def test_tail_of_a_channel_without_a_slash_prints_its_messages_and_no_hint
    herald_publish("chat", '{"text":"no slash"}', dir: @dir)
    herald_publish("/chat", '{"text":"slash"}', dir: @dir)
    tail = Tail.new("chat", "--from", "0", "--dir", @dir)
    assert_equal '{"text":"no slash"}', tail.gets
    herald_publish("chat", '{"text":"live, no slash"}', dir: @dir)
    assert_equal '{"text":"live, no slash"}', tail.gets
    status, err = tail.stop
    assert_equal 0, status.exitstatus
    assert_equal "", err, "chat has messages: no hint"
  end

  def test_tail_of_an_empty_channel_with_a_slash_hints_at_the_one_without
    herald_publish("news", '{"text":"no slash"}', dir: @dir)
    tail = Tail.new("/news", "--dir", @dir)
    assert_equal %(note: channel "/news" is empty; did you mean "news"?), tail.err_gets
    assert_nil tail.gets(timeout: 0.5)
    status, err = tail.stop
    assert_equal 0, status.exitstatus
    assert_equal "", err, "one note"
  end

  def test_tail_of_an_empty_channel_with_a_slash_says_nothing_extra
    tail = Tail.new("/quiet", "--from", "0", "--dir", @dir) # --from 0: the message below arrives either way
    herald_publish("/quiet", '{"n":1}', dir: @dir)
    assert_equal '{"n":1}', tail.gets
    status, err = tail.stop
    assert_equal 0, status.exitstatus
    assert_equal "", err
  end

  def test_tail_ends_when_its_reader_goes_away
    herald_publish("/chat", '{"n":1}', dir: @dir)
    tail = Tail.new("/chat", "--from", "0", "--dir", @dir) # as in `herald tail /chat --from 0 | head -1`
    assert_equal '{"n":1}', tail.gets
    tail.close_stdout
    herald_publish("/chat", '{"n":2}', dir: @dir)
    status, _err = tail.stop(nil, timeout: 30)
    refute_nil status, "tail kept running with nobody reading"
    assert_equal 0, status.exitstatus
  end

  private

  def invocation_problems(err, out, st, status, message)
    lines = err.lines
    wrong = []
    wrong << "exit status #{st&.exitstatus.inspect}, expected #{status}" unless st&.exitstatus == status
    wrong << "wrote to standard output" unless out.empty?
    wrong << "does not start with \"herald: \" or \"herald COMMAND: \"" unless lines.first&.match?(/\Aherald( \w+)?: /)
    wrong << "does not say #{message.inspect}" unless lines.first&.match?(message)
    wrong << "#{lines.size} lines" if lines.size > 2 || (lines[1] && !lines[1].start_with?("usage: herald "))
    wrong << "a backtrace" if err.match?(/^\s*from |\.rb:\d+/)
    wrong
  end

  # RUBYOPT for a child that runs as if the gem were not in the bundle (the exe's require raises LoadError).
  def hide_gem(name)
    script = File.join(@tmp, "hide-#{name}.rb")
    File.write(script, "$LOAD_PATH.reject! { |p| File.basename(File.dirname(p)).match?(/\\A#{name}-\\d/) }\n")
    "#{ENV["RUBYOPT"]} -r#{script}"
  end
end
