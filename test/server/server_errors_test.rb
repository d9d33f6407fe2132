# frozen_string_literal: true

require "test_helper"
require "logger"
require "socket"
require "stringio"
require "herald/server"

# `herald server` silences Puma's own output, so every error Puma catches must reach Herald.logger:
# a 500 is never silent. A request Puma cannot parse is the client's fault: a 400, not an ERROR line.
# Run against both front ends: Herald's own (the default) and Puma (`front: :puma`, PumaServerErrorsTest).
class ServerErrorsTest < Minitest::Test
  FRONT = :herald
  BOOM = ->(demo, _bus) { ->(env) { (env["PATH_INFO"] == "/boom") ? raise(KeyError, "no such thing \xFF".b) : demo.call(env) } }

  def setup
    @log = StringIO.new
    @previous = Herald.instance_variable_get(:@logger)
    Herald.logger = Logger.new(@log)
    @server = Herald::Server.new(port: 0, store: Herald::Store::Memory.new, log: nil, app: BOOM, front: self.class::FRONT).start
  end

  def teardown
    @server.stop
    @server.wait
    Herald.logger = @previous
  end

  def test_an_exception_in_the_app_is_a_500_that_is_logged_with_its_backtrace
    status, body = request("GET /boom?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert_equal 500, status
    assert_equal "500 Internal Server Error: the error is in the server's log\n", body
    log = @log.string.scrub
    assert_match(/ERROR -- : http server: Rack app: KeyError: no such thing \uFFFD \(GET \/boom\)\n  .*server_errors_test.rb/, log,
      "Puma's error, its request line (the bytes that are not UTF-8 replaced) and its backtrace")
  end

  def test_a_malformed_request_is_a_400_and_no_error
    status, body = request("GET / HTTP/1.1\r\nBad Header\r\n\r\n")
    assert_equal 400, status
    assert_equal "400 Bad Request\n", body
    refute_match(/ERROR/, @log.string)
    assert_equal 200, request("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").first
  end

  # Puma 6.6 raises NoMethodError, ArgumentError or RangeError on these, and would answer 500; Herald's
  # front end reads the body itself and refuses them as malformed (a DEBUG line).
  def test_requests_puma_fails_to_read_are_a_400_and_a_warning
    ["\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab\r\n0\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n#{"f" * 20}\r\nx\r\n"].each do |bytes|
      assert_equal 400, request(bytes).first, bytes.inspect
    end
    refute_match(/ERROR/, @log.string)
    if self.class::FRONT == :puma
      assert_match(/WARN -- : http server: a request Puma could not read was refused \(400\): NoMethodError: .*puma/, @log.string)
    else
      assert_match(/DEBUG -- : http server: request refused \(400\): bad chunk line "ffffffffffffffffffff"/, @log.string)
    end
    assert_equal 200, request("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").first
  end

  # A body larger than any endpoint takes is refused without reading it all (Puma would spool it to a file
  # from its reactor thread, holding up every request still being read). Puma 6.6 checks the length at its
  # second read of the request, so the client sends two pieces of a 10 MB body, then waits.
  def test_a_body_too_large_for_any_endpoint_is_a_413_before_it_is_read
    socket = TCPSocket.new("127.0.0.1", @server.port)
    socket.write("POST /chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 10000000\r\n\r\n#{"x" * 1000}")
    sleep 0.1
    socket.write("x" * 1000)
    assert socket.wait_readable(3), "no answer while the body is still coming"
    assert_match(/\AHTTP\/1\.1 413 /, socket.readpartial(1000))
    assert_equal 200, request("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").first
  ensure
    socket&.close
  end

  private

  def request(bytes)
    socket = TCPSocket.new("127.0.0.1", @server.port)
    socket.write(bytes)
    head, body = socket.read.split("\r\n\r\n", 2)
    [head[/\AHTTP\/1\.[01] (\d+)/, 1].to_i, body]
  ensure
    socket&.close
  end
end

class PumaServerErrorsTest < ServerErrorsTest
  FRONT = :puma
end
