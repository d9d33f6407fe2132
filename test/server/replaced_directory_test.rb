# frozen_string_literal: true

require "test_helper"
require "json"
require "net/http"
require "securerandom"
require_relative "../support/spawned_server"

# issue 23, defect 3, as an operator meets it: the log directory of a running `herald server` is emptied and
# recreated (a dev store wiped, a backup restored) and another process publishes there. Before, every poll
# for as long as the server ran (6 s and beyond) answered with the deleted messages and none of the new
# ones, for request bodies the server had never seen too (so not its reply cache); only a restart helped.
class ServerReplacedDirectoryTest < Minitest::Test
  BOUND = 3.0

  def setup
    @tmp = Dir.mktmpdir("herald-server-replaced")
    @log = File.join(@tmp, "log")
    FileUtils.mkdir_p(@log)
    @server = Herald::SpawnedServer.new(Herald::SpawnedServer.herald_command(@log), dir: @tmp)
  end

  def teardown
    @server&.stop
    FileUtils.rm_rf(@tmp)
  end

  def test_polls_see_the_new_directory_after_it_is_wiped_under_the_server
    publish("/chat", *(0..4).map { |i| "old #{i}" })
    assert_equal (0..4).map { |i| "old #{i}" }, data(poll({"/chat" => 0}))
    parked = Thread.new { poll({"/chat" => 5}, long: true) } # held by the server's event loop
    sleep 0.3

    FileUtils.rm_rf(@log)
    FileUtils.mkdir_p(@log)
    publish("/chat", "new ✓", "nouveau 👋", "\u0000")
    started = monotonic
    answers = []
    until (answer = data(poll({"/chat" => 0}))) == ["new ✓", "nouveau 👋", "\u0000"] # a body never seen before, each time
      answers << answer
      flunk "after #{BOUND} s polls still answer #{answers.last.inspect} (#{answers.size} polls)" if monotonic - started > BOUND
      sleep 0.05
    end
    puts "\n  polls answered from the new directory #{((monotonic - started) * 1000).round} ms after the publishes (#{answers.size} polls before)"

    assert parked.join(BOUND), "the parked long poll was answered (its position belongs to the deleted log)"
    status = poll({"/chat" => 5}).find { |m| m["channel"] == "/__status" }
    assert_equal({"/chat" => 3}, status && status["data"], "a client ahead of the new log is told its position")

    follower = Thread.new { poll({"/chat" => 3}, long: true) } # parked on the new directory
    sleep 0.3
    publish("/chat", "later")
    assert follower.join(BOUND), "a long poll parked after the reset hears another process's publish"
    assert_equal ["later"], data(follower.value)
  end

  private

  # From another process, into whatever directory is there now (one process for several: each boot costs a second).
  def publish(channel, *texts)
    script = "bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: ARGV[0])); " \
      "JSON.parse(ARGV[2]).each { |t| bus.publish(ARGV[1], t) }; bus.close"
    out = IO.popen([RbConfig.ruby, "-I", File.join(Herald::SpawnedServer::ROOT, "lib"), "-rherald", "-rjson", "-e", script,
      @log, channel, JSON.generate(texts)], err: [:child, :out], &:read)
    assert $?.success?, "publishing failed: #{out}"
  end

  def poll(positions, long: false)
    uri = URI("#{@server.url}/message-bus/#{SecureRandom.hex(8)}/poll#{"?dlp=t" unless long}")
    response = Net::HTTP.start(uri.host, uri.port, read_timeout: 30) do |http|
      http.post(uri.request_uri, JSON.generate(positions), "Content-Type" => "application/json", "Dont-Chunk" => "true")
    end
    assert_equal "200", response.code, response.body
    JSON.parse(response.body.force_encoding(Encoding::UTF_8))
  end

  def data(messages) = messages.reject { |m| m["channel"] == "/__status" }.map { |m| m["data"] }

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
