# frozen_string_literal: true

require "socket"

module Herald
  module Store
    class Log
      # Cross-process wakeups: every open store binds a UNIX datagram socket and leaves a marker file
      # <dir>/wakeup/<pid>-<n>.sock; after an append the writer sends one byte to every other marker's
      # socket. A listener thread blocks on its socket and calls back, so readers in other processes
      # learn of new records within a millisecond or two. The sockets live in Linux's abstract namespace,
      # named after the directory's device and inode: no 108-byte path limit, nothing left on disk by a
      # killed process but its marker, which the first writer to get ECONNREFUSED removes.
      # When no marker can be written (read-only directory), the listener polls every POLL seconds.
      class Wakeup
        POLL = 0.5
        PEERS_TTL = 0.25 # how long the list of peer sockets is trusted before the directory is read again
        @count = 0
        class << self
          attr_accessor :count
        end

        def initialize(dir, &on_wake)
          @dir = dir
          @on_wake = on_wake
          Wakeup.count += 1
          @name = "#{Process.pid}-#{Wakeup.count}.sock"
          @socket = bind
          @sender = Socket.new(:UNIX, :DGRAM)
          @peers = []
          @peers_at = -PEERS_TTL
          @thread = Thread.new { listen }
          @thread.name = "herald-log-wakeup"
        end

        # Pokes every other open store of this directory. Never blocks: a peer whose buffer is full has
        # a wakeup pending already.
        def notify
          refresh_peers
          dead = nil
          @peers.each do |name, addr|
            @sender.sendmsg_nonblock(".", 0, addr, exception: false)
          rescue Errno::ECONNREFUSED, Errno::ENOENT
            (dead ||= []) << name
          rescue SystemCallError
            nil
          end
          dead&.each { |name| forget(name) }
        end

        def close
          @thread.kill
          @socket&.close
          @sender.close
          File.unlink(File.join(@dir, @name)) if @socket
        rescue SystemCallError, IOError
          nil
        end

        private

        def bind
          stat = File.stat(@dir)
          @prefix = "\0herald-#{stat.dev.to_s(16)}-#{stat.ino.to_s(16)}-"
          sock = Socket.new(:UNIX, :DGRAM)
          sock.bind(address(@name))
          File.write(File.join(@dir, @name), "")
          sock
        rescue SystemCallError
          sock&.close
          nil
        end

        def address(name) = Socket.sockaddr_un(@prefix + name)

        def listen
          loop do
            if @socket
              IO.select([@socket], nil, nil, POLL)
              nil while @socket.recv_nonblock(64, exception: false).is_a?(String)
            else
              sleep POLL
            end
            wake
          end
        rescue IOError
          nil # closed
        end

        def wake
          @on_wake.call
        rescue => e
          Herald.logger.warn "log reader failed: #{e.class}: #{e.message}"
          sleep POLL
        end

        def refresh_peers
          now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return if now - @peers_at < PEERS_TTL
          @peers_at = now
          return @peers = [] unless @prefix
          @peers = Dir.children(@dir).filter_map do |name|
            next if name == @name || !name.end_with?(".sock")
            [name, address(name)]
          end
        rescue SystemCallError
          @peers = []
        end

        def forget(name)
          File.unlink(File.join(@dir, name))
        rescue SystemCallError
          nil
        ensure
          @peers.reject! { |n, _| n == name }
        end
      end
    end
  end
end
