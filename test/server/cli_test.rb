# frozen_string_literal: true

require "test_helper"
require "stringio"
require "socket"
require "herald/cli"

# `herald server` option handling (the running server is covered by http_client_test.rb and test/browser).
class ServerCLITest < Minitest::Test
  def test_usage_lists_the_server_command
    err = StringIO.new
    assert_equal 2, Herald::CLI.run([], out: StringIO.new, err: err)
    assert_includes err.string, "server [--port 9292] [--host 127.0.0.1] [--dir DIR]"
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
end
