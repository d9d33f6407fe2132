# frozen_string_literal: true

require_relative "../test_helper"
require "herald/server"

# The env the front builds from Puma's parse, on its own (the front's tests cover it end to end).
class RackEnvTest < Minitest::Test
  Conn = Struct.new(:remote_addr)

  def setup
    @hijacked = []
    hijacker = Object.new
    hijacked = @hijacked
    hijacker.define_singleton_method(:hijack) { |conn, env| hijacked << [conn, env] && :io }
    @builder = Herald::Server::RackEnv.new(host: "0.0.0.0", port: 9292, hijacker: hijacker)
  end

  def build(env) = @builder.build(Conn.new("127.0.0.9"), {"SERVER_PROTOCOL" => "HTTP/1.1"}.merge(env), "body é")

  def test_server_name_and_port_come_from_the_host_header
    assert_equal ["example.com", "8080"], build("REQUEST_PATH" => "/", "HTTP_HOST" => "example.com:8080").values_at("SERVER_NAME", "SERVER_PORT")
    assert_equal ["[::1]", "9000"], build("REQUEST_PATH" => "/", "HTTP_HOST" => "[::1]:9000").values_at("SERVER_NAME", "SERVER_PORT")
    assert_equal ["[::1]", "80"], build("REQUEST_PATH" => "/", "HTTP_HOST" => "[::1]").values_at("SERVER_NAME", "SERVER_PORT")
    assert_equal ["ünï.test", "80"], build("REQUEST_PATH" => "/", "HTTP_HOST" => "ünï.test").values_at("SERVER_NAME", "SERVER_PORT")
    assert_equal ["0.0.0.0", "9292"], build("REQUEST_PATH" => "/").values_at("SERVER_NAME", "SERVER_PORT")
  end

  def test_an_absolute_target_gives_its_path_and_a_bad_one_is_refused
    assert_equal "/a/b", build("REQUEST_URI" => "http://h:1/a/b?q=1")["PATH_INFO"]
    assert_equal "/", build("REQUEST_URI" => "http://h")["PATH_INFO"]
    error = assert_raises(Herald::Server::HttpConnection::RequestRefused) { build("REQUEST_URI" => "*") }
    assert_equal 400, error.status
  end

  def test_the_body_the_remote_address_and_hijack
    env = build("REQUEST_PATH" => "/x")
    assert_equal "body é", env["rack.input"].read
    assert_equal "127.0.0.9", env["REMOTE_ADDR"]
    assert_equal "", env["QUERY_STRING"]
    assert_equal :io, env["rack.hijack"].call
    assert_same env, @hijacked.first.last
  end

  def test_keep_alive_by_version_and_connection_header
    cases = {["HTTP/1.1", nil] => true, ["HTTP/1.1", "close"] => false, ["HTTP/1.1", "Keep-Alive, Close"] => false,
             ["HTTP/1.0", nil] => false, ["HTTP/1.0", "keep-alive"] => true, ["HTTP/1.0", "close"] => false}
    cases.each do |(version, connection), keep|
      env = {"SERVER_PROTOCOL" => version, "HTTP_CONNECTION" => connection}.compact
      assert_equal keep, @builder.keep_alive?(env), [version, connection].inspect
    end
  end
end

class ResponseHeadTest < Minitest::Test
  def head(...) = Herald::Server::ResponseHead.new.call(...)

  def test_framing_headers_are_the_fronts_and_multi_line_values_repeat
    out = head({"SERVER_PROTOCOL" => "HTTP/1.1"}, 200, {"set-cookie" => "a=1\nb=2", "Connection" => "x", "rack.hijack" => 1, "x-a" => ["1", "2"]}, 5, true)
    assert_equal "HTTP/1.1 200 OK\r\nset-cookie: a=1\r\nset-cookie: b=2\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 5\r\n\r\n", out
  end

  def test_an_app_content_length_is_kept_and_bodyless_statuses_get_none
    assert_equal "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", head({}, 200, {"Content-Length" => "3"}, 9, true)
    assert_equal "HTTP/1.1 204 No Content\r\n\r\n", head({}, 204, {}, 0, true)
  end

  def test_connection_close_and_http_1_0_keep_alive_and_unknown_status
    assert_equal "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n", head({"SERVER_PROTOCOL" => "HTTP/1.0"}, 200, {}, 0, true)
    assert_equal "HTTP/1.1 599 CUSTOM\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n", head({}, 599, {}, nil, false, chunked: true)
  end
end
