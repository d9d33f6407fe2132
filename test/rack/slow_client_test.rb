# frozen_string_literal: true

require_relative "rack_helper"

# A client that stops reading is dropped (bounded buffer, or write timeout) and never slows the others.
class SlowClientTest < Minitest::Test
  include Herald::RackHelpers

  Server = Herald::PumaServer
  BIG = "x" * 32_768
  COUNT = 300 # 10 MB: more than loopback's socket buffers take

  def stalled_socket(server, client)
    server.request({"/chat" => nil}, client: client, rcvbuf: 4096)
  end

  def test_dropped_over_the_buffer_limit_while_others_get_everything
    # The stalled client would free a held-back loop only after 30 s (its hold and write timeout): a reply
    # well under that was not held back by it, however loaded the machine (CI at load 13 took 9.3 s).
    mw = middleware(long_polling_interval: 30, max_buffer: 1024 * 1024, write_timeout: 30)
    server = puma(mw)
    slow = stalled_socket(server, "slow")
    fast = server.request({"/chat" => nil}, client: "fast")
    Server.read_until(fast, "[]\r\n|\r\n")
    parked(mw, 2)
    started = monotonic
    reader = read_in_child(fast, "\"#{COUNT - 1}:", timeout: 28)
    COUNT.times do |i|
      @bus.publish("/chat", "#{i}:#{BIG}")
      sleep 0.01 if i % 10 == 9 # bursts of 320 KB: the fast reader keeps up, the stalled one falls behind
    end
    got = reader.value
    assert_equal COUNT, got.scan(/"\d+:x/).size
    # Not held back by the stalled client: well before its 30 s hold or write timeout would free it
    # (a loaded 2-core machine takes 1-10 s to push the 10 MB).
    assert_operator monotonic - started, :<, 20
    eventually(message: "the stalled client was not dropped") { mw.active_clients == 1 }
  ensure
    slow&.close
    fast&.close
  end

  def test_dropped_after_the_write_timeout
    mw = middleware(long_polling_interval: 10, max_buffer: 64 * 1024 * 1024, write_timeout: 0.3)
    server = puma(mw)
    slow = stalled_socket(server, "slow")
    parked(mw)
    COUNT.times { |i| @bus.publish("/chat", "#{i}:#{BIG}") }
    started = monotonic
    eventually(timeout: 6, message: "the stalled client was not dropped") { mw.active_clients == 0 }
    assert_operator monotonic - started, :<, 6, "dropped by the 0.3 s write timeout, not at the end of the 10 s hold"
    fresh = server.request({"/chat" => nil}, client: "fresh", headers: {"Dont-Chunk" => "t"})
    parked(mw)
    @bus.publish("/chat", "after")
    assert_equal ["after"], ids(JSON.parse(Server.read(fresh)[2]))
  ensure
    slow&.close
  end

  def test_a_client_that_hangs_up_is_forgotten
    mw = middleware(long_polling_interval: 10)
    server = puma(mw)
    socket = server.request({"/chat" => nil})
    Server.read_until(socket, "[]\r\n|\r\n")
    parked(mw)
    socket.close
    eventually(message: "a closed connection stayed parked") { mw.active_clients == 0 }
  end

  private

  # The fast client reads in a process of its own, as a browser does. A reader thread in this process shares
  # the GVL with the publishing loop and Puma: on a loaded machine it fell over a megabyte behind and was
  # dropped itself (Ruby 3.3: 6 of 10 runs at load 10-15 on 2 cores; Ruby 3.1: 1 of 10).
  def read_in_child(socket, text, timeout:)
    r, w = IO.pipe
    pid = fork do
      r.close
      w.write(Server.read_until(socket, text, timeout: timeout))
    rescue => e
      w.write("#{e.class}: #{e.message[0, 200]}")
    ensure
      exit!(0)
    end
    w.close
    in_thread { r.read.tap { Process.wait(pid) } }
  end

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end
