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
      # The same sockets carry requests for the write lock (WriteLease): a LEASE byte instead of a poke.
      class Wakeup
        POLL = 0.5
        PEERS_TTL = 0.25 # how long the list of peer sockets is trusted before the directory is read again
        POKE = "."
        LEASE = "L"
        WATCH = "w.sock" # how a watcher's marker ends (#watch_socket): poked by appends, never asked for leases
        @count = 0
        class << self
          attr_accessor :count
        end

        # Asks every open store of the directory but `except` for the write lock (WriteLease): the one
        # holding it gives it up. From a socket of its own: the asker may have no Wakeup yet (opening).
        def self.ask_for_lease(dir, except: nil)
          stat = File.stat(dir)
          prefix = "\0herald-#{stat.dev.to_s(16)}-#{stat.ino.to_s(16)}-"
          own = except&.name
          Socket.new(:UNIX, :DGRAM).then do |sender|
            Dir.children(dir).each do |name|
              next if name == own || !name.end_with?(".sock") || name.end_with?(WATCH)
              sender.sendmsg_nonblock(LEASE, 0, Socket.sockaddr_un(prefix + name), exception: false)
            rescue SystemCallError
              nil # a dead store's marker: its writer removes it
            end
          ensure
            sender.close
          end
        rescue SystemCallError
          nil # no wakeup directory: nobody to ask, the asker keeps polling the lock
        end

        attr_reader :name

        def initialize(dir, on_lease_request: nil, on_tick: nil, &on_wake)
          @dir = dir
          @on_wake = on_wake
          @on_lease_request = on_lease_request
          @on_tick = on_tick # after every wait; returns how long the next wait may be (nil: POLL)
          Wakeup.count += 1
          @own = "#{Process.pid}-#{Wakeup.count}"
          @name = "#{@own}.sock"
          @socket = bind
          @watch_sockets = []
          @sender = Socket.new(:UNIX, :DGRAM)
          @peers = []
          @peers_at = -PEERS_TTL
          @thread = Thread.new { listen }
          @thread.name = "herald-log-wakeup"
        end

        # Pokes every other open store of this directory. Never blocks: a peer whose buffer is full has
        # a wakeup pending already. `now`: the monotonic clock, when the caller just read it.
        def notify(now = Process.clock_gettime(Process::CLOCK_MONOTONIC))
          refresh_peers(now) if now - @peers_at >= PEERS_TTL
          return if @peers.empty?
          dead = nil
          @peers.each do |name, addr|
            @sender.sendmsg_nonblock(POKE, 0, addr, exception: false)
          rescue Errno::ECONNREFUSED, Errno::ENOENT
            (dead ||= []) << name
          rescue SystemCallError
            nil
          end
          dead&.each { |name| forget(name) }
        rescue IOError
          nil # retired meanwhile (the directory was replaced): the new Wakeup pokes the new directory's stores
        end

        # Wakes this store's own listener (it recomputes how long to wait: see WriteLease#lease_tick).
        def nudge
          @sender.sendmsg_nonblock(POKE, 0, address(@name), exception: false) if @socket
        rescue SystemCallError, IOError
          nil # closed: a closing store takes the lock for its last write, with no listener left
        end

        # A socket of a watcher's own (Store::Watchers, Log#watch), with its marker: other processes' appends
        # poke it as they poke the listener, so an event loop that selects on it learns of their records
        # without waiting for the listener thread to wake up and wake it in turn. nil when no marker can be
        # written (the listener polls then, and the watcher hears of the records through it).
        def watch_socket
          return nil unless @socket
          name = "#{@own}-#{@watch_sockets.size + 1}#{WATCH}"
          sock = Socket.new(:UNIX, :DGRAM)
          sock.bind(address(name))
          File.write(File.join(@dir, name), "")
          WatchSocket.new(sock, File.join(@dir, name)).tap { |w| @watch_sockets << w }
        rescue SystemCallError
          sock&.close
          nil
        end

        # One watcher's socket: #io to select on, #drain once it is readable, #close when done.
        class WatchSocket
          attr_reader :io

          def initialize(io, marker)
            @io = io
            @marker = marker
          end

          # Reads every poke waiting (one read of the log serves them all).
          def drain
            nil while @io.recv_nonblock(64, exception: false).is_a?(String)
          rescue IOError, SystemCallError
            nil
          end

          def close
            return if @io.closed?
            @io.close
            File.unlink(@marker)
          rescue SystemCallError, IOError
            nil
          end
        end

        # True while this process listens (asked-for leases are heard): false without a socket, and in a
        # forked child holding its parent's Wakeup (the thread did not survive the fork).
        def listening? = !@socket.nil? && @thread.alive?

        def close
          @watch_sockets.each(&:close)
          retire
        end

        # Stops listening, and leaves the watch sockets to their watchers (Store::Log::Replacement: the
        # directory was replaced; an event loop selecting on one cancels it itself). Called by the listener
        # thread itself, it lets it finish: the next wait finds the socket closed.
        def retire
          @retired = true # (a listener without a socket has no closed socket to stop at)
          @thread.kill unless @thread.equal?(Thread.current)
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
          timeout = POLL
          until @retired
            asked = false
            if @socket
              IO.select([@socket], nil, nil, timeout)
              while (data = @socket.recv_nonblock(64, exception: false)).is_a?(String)
                asked ||= data == LEASE
              end
            else
              sleep POLL
            end
            call(@on_lease_request) if asked && @on_lease_request # first: a writer waits for it
            call(@on_wake)
            timeout = (@on_tick&.call || POLL).clamp(0.001, POLL)
          end
        rescue IOError, Errno::EBADF
          nil # closed (EBADF: by a retire on another thread, before this thread's kill took effect)
        end

        def call(callback)
          callback.call
        rescue => e
          Herald.logger.warn "log reader failed: #{e.class}: #{e.message}"
          sleep POLL
        end

        def refresh_peers(now)
          @peers_at = now
          return @peers = [] unless @prefix
          own = "#{@own}-" # this store's watchers: woken by Log#append itself (Store::Watchers)
          @peers = Dir.children(@dir).filter_map do |name|
            next if name == @name || !name.end_with?(".sock") || name.start_with?(own)
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
