# frozen_string_literal: true

require "nio"
require "socket"

module Herald
  module Rack
    # The one event loop thread that holds every parked client of a process (NIO::Selector: epoll/kqueue).
    #
    # Inputs arrive on a queue: connections parked by request threads and clients gone. Messages are read
    # from the store by this loop itself, after its own cursor, when the store says something is new
    # (Store#watch: the appending thread wakes the loop, and for the Log another process's append pokes a
    # socket the loop selects on): no thread in between, each of which cost an OS wake-up and a GVL hand-off.
    # With a networked store (Redis, PostgreSQL), whose reads are round trips the loop must not wait for,
    # the messages come from one bus subscription (all channels) on the queue. Per message it looks up the readers of the
    # message's channel key, checks each reader's position and permissions, and writes the message's cached
    # bytes; nothing here blocks (SocketConnection buffers, QueueConnection queues). Timers (long-poll
    # deadlines) are a list sorted by deadline. An error with one client drops that client, never the loop.
    class Reactor
      TICK = 0.25 # longest select: how often deadlines and stalled writers are checked at the latest
      # A fan-out's sockets can be closed once about as long again as its writes took has passed (at most
      # `close_delay` after them), leaving the cores to other worker processes' writes and the clients' reads
      # first; every reply carries its length (or its last chunk), so nobody waits for the close. Off by
      # default: on a quiet 2-core machine a 50 ms delay cost the loop 7.6 us more CPU per client (the client
      # hangs up first, so the server's close does the TCP teardown) and raised client p99 at 1,000 clients
      # 23.0 -> 26.1 ms and at 10,000 184.7 -> 197.0 ms (bench/http_latency_bench.rb, same run); under load it
      # lowered client p50s. A knob for benchmarks and tests.
      CLOSE_DELAY = 0.0

      attr_accessor :close_delay

      attr_reader :bus
      # For benchmarks: an object whose #start(msg) returns nil or a per-fan-out recorder (#wrote after
      # each shared write, #written(count) after the last, #done after the bookkeeping and closes).
      attr_accessor :trace

      def initialize(bus:, wire:, filters:, write_timeout:, on_error:)
        @bus = bus
        @wire = wire
        @filters = filters
        @write_timeout = write_timeout
        @on_error = on_error
        @selector = NIO::Selector.new
        @inbox = Thread::Queue.new
        @clients = {} # client id => Connection
        @index = {} # channel key (Client.key) => {Connection => true}
        @timers = [] # Connections by deadline, oldest first
        @writing = {}.compare_by_identity # SocketConnections with bytes the kernel has not taken yet
        @released = [] # closed SocketConnections whose sockets are closed after the current fan-out
        @release_at = nil # when the sockets of the last fan-outs are to be closed (close_delay)
        @close_delay = CLOSE_DELAY
        @release_traces = [] # their trace recorders, done once the sockets are closed
        @epoch = bus.store.known_epoch # the store's epoch @cursor and the parked clients' positions belong to
        @cursor = bus.store.last_global_id # the last global id fanned out
        @closed = false
        @trace = nil
        @store_moved = true # set by the store's watch callback: read it after @cursor
        @watch = watch_store
        @subscription = @watch ? nil : bus.subscribe { |msg| push(msg) }.tap(&:uncounted!)
        @thread = Thread.new { run }
        @thread.name = "herald-reactor" if @thread.respond_to?(:name=)
        Metrics::PARKED.track(self)
      end

      # Parked clients, for max_active_clients.
      def size = @clients.size

      def alive? = @thread.alive?

      # From a request thread: hold `conn` until its deadline. `msgs`/`status` are its backlog; `snapshot`
      # is the store's last global id before that backlog was read (to catch up on a race, see #admit), and
      # `epoch` the store's epoch then (a client whose backlog came from before a reset is let go at once).
      def park(conn, msgs, status, snapshot, epoch = nil)
        push([:park, conn, msgs, status, snapshot, epoch])
      end

      def gone(conn) = push([:gone, conn])

      def close
        return if @closed
        @closed = true
        @subscription&.unsubscribe
        Metrics::PARKED.untrack(self)
        @selector.wakeup
        @thread.join(5)
        @watch&.cancel
      end

      private

      def push(item)
        @inbox << item
        @selector.wakeup
      rescue IOError, ClosedQueueError
        nil
      end

      # The store wakes this loop for every append (Memory, Log). A Log's watch also has a socket that other
      # processes' appends poke, selected on here beside the clients.
      def watch_store
        watch = @bus.store.watch { moved } or return nil # (networked stores: messages come from a bus subscription)
        @watch_monitor = nil
        if watch.io
          @watch_monitor = @selector.register(watch.io, :r)
          @watch_monitor.value = watch
        end
        watch
      end

      # The store was reset (a log directory replaced, a flushed Redis): its ids started over, so the
      # parked clients' positions and @cursor mean nothing there. Every parked client is answered (a long
      # poll with nothing) and asks again, reading the new store's backlog; the watch is made again (a
      # replaced log's wakeup sockets are new ones).
      def restart
        @epoch = @bus.store.known_epoch
        @clients.values.each { |conn| end_connection(conn) }
        return @cursor = 0 unless @watch # messages come from the bus, which starts the new epoch from its start
        @watch_monitor&.close
        @watch.cancel
        @watch = watch_store
        @cursor = @bus.store.last_global_id
      end

      # On the appending thread: only a flag and a wake-up, never the store's messages (read by the loop).
      # On this loop's own thread (records read in by #poked) the flag is enough.
      def moved
        @store_moved = true
        @selector.wakeup unless Thread.current.equal?(@thread)
      rescue IOError
        nil
      end

      # Another process appended: its records are read in on this thread, which runs the watch callback.
      def poked
        @watch.readable
      rescue => e
        report(e)
      end

      def run
        until @closed
          @selector.select(select_timeout) { |monitor| io_ready(monitor) }
          read_store if @store_moved
          drain
          expire
          sweep_stalled unless @writing.empty?
          release_closed
        end
      rescue => e
        report(e)
        retry unless @closed
      ensure
        shutdown if @closed
      end

      def select_timeout
        first = @timers.first&.deadline
        first = @release_at if @release_at && (first.nil? || @release_at < first)
        return TICK unless first
        (first - now).clamp(0, TICK)
      end

      def io_ready(monitor)
        conn = monitor.value
        return poked if conn.equal?(@watch)
        # Answered, its socket not closed yet (close_delay), and the client hung up: epoll would report it on
        # every turn until then.
        return monitor.close if conn.closed?
        if monitor.writable? && conn.flush
          @writing.delete(conn)
          monitor.interests = :r unless conn.closed?
        end
        conn.on_readable if monitor.readable? && !conn.closed?
        settle(conn)
      rescue => e
        fail_connection(conn, e)
      end

      # Fans out what the store holds after @cursor (the flag is cleared first: an append landing during the
      # read sets it again, so nothing is left behind). Parks queued meanwhile are admitted after (drain)
      # and catch up from the backlog (admit): fanning out first serves the clients already waiting first.
      def read_store
        @store_moved = false
        restart if @bus.store.known_epoch != @epoch
        loop do
          batch = @bus.store.global_backlog(@cursor, limit: Bus::BATCH)
          break if batch.empty?
          fan_out(batch) # moves @cursor
          break if batch.size < Bus::BATCH
        end
      rescue
        @store_moved = true # read again on the next turn (at the latest after TICK)
        raise
      end

      def drain
        batch = nil
        until @inbox.empty?
          item = @inbox.pop
          if item.is_a?(Message)
            restart if batch.nil? && @bus.store.known_epoch != @epoch # (the bus restarted first: these are the new epoch's)
            (batch ||= []) << item
            next
          end
          fan_out(batch) if batch
          batch = nil
          (item[0] == :park) ? admit(*item.drop(1)) : settle(item[1], gone: true)
        end
        fan_out(batch) if batch
      end

      # A new parked client. Superseding (docs/protocol.md 1.6): the connection with the greater __seq stays;
      # on a tie the new one wins. Then catch up if messages were fanned out between its backlog read
      # and now: they would otherwise never reach it.
      def admit(conn, msgs, status, snapshot, epoch = nil)
        return begin_connection(conn, msgs, status) && end_connection(conn) if epoch && epoch != @epoch
        if (old = @clients[conn.client.id])
          if old.client.seq > conn.client.seq
            return begin_connection(conn, msgs, status) && end_connection(conn)
          end
          end_connection(old)
        end
        return unless begin_connection(conn, msgs, status)
        @clients[conn.client.id] = conn
        conn.client.keys.each { |key| (@index[key] ||= {}.compare_by_identity)[conn] = true }
        conn.indexed = true
        insert_timer(conn)
        catch_up(conn) if @cursor > snapshot
      rescue => e
        fail_connection(conn, e)
      end

      def begin_connection(conn, msgs, status)
        if conn.is_a?(SocketConnection)
          nodelay(conn.io)
          conn.monitor = @selector.register(conn.io, :r)
          conn.monitor.value = conn
          conn.on_want_write { |c| want_write(c) }
          conn.on_close { |c| @released << c }
        end
        conn.start(msgs, status)
        !conn.closed?
      end

      # Streams write small chunks: without this, Nagle's algorithm and delayed ACKs add up to 40 ms each.
      def nodelay(io)
        io.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) if io.respond_to?(:setsockopt)
      rescue IOError, SystemCallError
        nil
      end

      # Closes the sockets of closed connections, unless a fan-out's are still waiting for their turn (then
      # these wait with them). force: now (shutdown).
      def release_closed(force: false)
        return if @release_at && !force && now < @release_at
        @release_at = nil
        @released.each(&:release)
        @released.clear
        return if @release_traces.empty?
        @release_traces.each(&:done)
        @release_traces.clear
      end

      # After a fan-out whose writes took `took` seconds (see CLOSE_DELAY). A later fan-out never postpones
      # the closes an earlier one set.
      def release_later(took, trace)
        @release_traces << trace if trace
        @release_at ||= now + took.clamp(0, @close_delay)
      end

      def want_write(conn)
        @writing[conn] = true
        conn.monitor.interests = :rw unless conn.closed?
      end

      def catch_up(conn)
        client = conn.client
        found = []
        client.positions.each do |channel, position|
          @bus.backlog(channel, position, site_id: client.site_id).each do |msg|
            client.positions[channel] = msg.message_id
            found << msg if client.allowed?(msg, @filters)
          end
        end
        deliver(conn, found) unless found.empty?
      end

      # Every reader gets its bytes first; all bookkeeping (unindexing answered polls, delivering to the
      # other kinds, closing sockets) waits until the last write, so the last reader is not kept waiting by
      # the Ruby work for the readers before it. A hijacked JSON long poll gets a whole reply shared by every
      # reader that takes the same messages with the same extra headers: built once per header set and looked
      # up by the client's own header lines, so neither a targeted message nor a CORS header hands one
      # client's bytes to another. One message (the usual batch) is written as the readers are found; for
      # several, each reader's messages are gathered first (a long poll answers with all of them at once).
      def fan_out(batch)
        return fan_out_one(batch.first) if batch.size == 1
        started = now
        trace = @trace&.start(batch.last)
        polls = {}.compare_by_identity # shared-reply poll => bit i set for each batch[i] it takes
        shared = 0 # messages taken by shared-reply polls (Metrics)
        others = nil # other readers => their messages
        batch.each_with_index do |msg, i|
          @cursor = msg.global_id if msg.global_id > @cursor
          readers = @index[Client.key(msg.channel, msg.site_id)] or next
          check = checked?(msg)
          readers.each_key do |conn|
            next unless take?(conn, msg, check: check)
            if conn.shared_reply?
              polls[conn] = (polls[conn] || 0) | (1 << i)
              shared += 1
            else
              ((others ||= {}.compare_by_identity)[conn] ||= []) << msg
            end
          end
        end
        replies = {} # extra header lines => {bits => the shared reply bytes}
        finished = []
        stragglers = []
        polls.each do |conn, bits|
          bytes = (replies[conn.extra_headers] ||= {})[bits] ||= poll_reply(batch, bits, conn.extra_headers)
          (conn.write_reply(bytes) ? finished : stragglers) << conn
          trace&.wrote
        end
        after_fan_out(finished, stragglers, others, trace, started, taken: polls)
        batch.each { |msg| written(msg, 0) } if shared > 0 || others
        Metrics::DELIVERED.add(shared, Metrics::LONG_POLL) if shared > 0
      end

      # The usual fan-out: one message. Per reader only what cannot wait: its position, its permission when the
      # message is targeted, and the write of the shared reply (the same bytes for every reader with the same
      # extra headers: one header-set comparison, no lookup, while they repeat). A reply the kernel took whole
      # leaves its connection closed but its socket open; after the last write those are unindexed together
      # and their sockets closed in one pass (after_fan_out).
      def fan_out_one(msg)
        @cursor = msg.global_id if msg.global_id > @cursor
        key = Client.key(msg.channel, msg.site_id)
        readers = @index[key] or return
        started = now
        trace = @trace&.start(msg)
        check = checked?(msg)
        channel = msg.channel
        id = msg.message_id
        headers = reply = replies = nil # the last reader's header lines and their reply; other header sets
        finished = [] # answered readers whose reply the kernel took whole: closed, their sockets still open
        stragglers = [] # the other answered ones: their reply partly written, or their write failed
        others = nil
        readers.each_key do |conn|
          positions = conn.client.positions
          next if id <= (positions[channel] || 0)
          positions[channel] = id
          next if check && !allowed?(conn, msg)
          unless conn.shared_reply?
            (others ||= {}.compare_by_identity)[conn] = [msg]
            next
          end
          unless conn.extra_headers == headers
            headers = conn.extra_headers
            reply = (replies ||= {})[headers] ||= @wire.poll_reply(msg, headers)
          end
          (conn.write_reply(reply) ? finished : stragglers) << conn
          trace&.wrote
        end
        after_fan_out(finished, stragglers, others, trace, started, key: key)
        written(msg, finished.size + stragglers.size)
      end

      # Metrics of a fan-out, after its writes: the messages of the shared replies (the other readers count
      # their own in Connection#deliver), and the time from the message's append (the store's wall clock) to now.
      def written(msg, shared)
        Metrics::DELIVERED.add(shared, Metrics::LONG_POLL) if shared > 0
        Metrics::DELIVERY_LATENCY.observe(Process.clock_gettime(Process::CLOCK_REALTIME) - msg.created_at)
      end

      # The bookkeeping after the writes: unindex the answered polls, deliver to the other readers, close the
      # sockets of the finished replies (now, or after close_delay). Stragglers (a reply partly written, or a
      # failed write) close through their connection (#release_closed). taken: each answered poll's bits
      # (fan_out), for deliver.herald's message count; one message without. key: the channel key of a
      # one-message fan-out, whose readers may be unindexed at once.
      def after_fan_out(finished, stragglers, others, trace, started, taken: nil, key: nil)
        took = now - started
        trace&.written(finished.size + stragglers.size)
        if Instrumentation.listening?(Connection::DELIVER)
          [finished, stragglers].each do |list|
            list.each { |conn| conn.delivered(taken ? taken[conn].to_s(2).count("1") : 1) }
          end
        end
        unindex(finished, stragglers, key)
        stragglers.each do |conn|
          next unless conn.closed?
          @writing.delete(conn)
          conn.unwatch
        end
        others&.each { |conn, msgs| deliver(conn, msgs) }
        release_finished(finished)
        release_later(took, trace)
      end

      # Sockets whose whole reply is out: closed now, or with the other closed ones after close_delay.
      # Not at each write: sending the reply with MSG_MORE and closing at once puts the FIN in the reply's
      # segment (3.9 segments a reply instead of 5.6-6.0) and cut the loop's CPU from 30 to 24 us a client, but
      # every client then waits for the closes before it (22 instead of 13 us a client before the reply is out):
      # at 10,000 clients client p99 rose, 1 process 369 vs 225 ms (bench/RESULTS.md, "Closing a fan-out's sockets").
      def release_finished(finished)
        if @close_delay.zero?
          finished.each(&:release)
        else
          finished.each(&:unwatch)
          @released.concat(finished)
        end
      end

      # Forgets answered polls. When they are all of key's readers (the usual one-message fan-out), key's
      # entry goes at once instead of one reader at a time; readers under other keys as well leave those.
      def unindex(finished, stragglers, key)
        readers = key && @index[key]
        gone = (readers && readers.size == finished.size + stragglers.size && @index.delete(key)) ? key : nil
        finished.each { |conn| remove(conn, gone) }
        stragglers.each { |conn| remove(conn, gone) }
      end

      # Whether a message needs each reader's permission checked: targeted, or client message filters set.
      def checked?(msg) = !!(msg.client_ids || msg.user_ids || msg.group_ids || !@filters.empty?)

      # The shared reply for the messages of batch whose bits are set, in batch order.
      def poll_reply(batch, bits, extra_headers)
        msgs = batch.select.with_index { |_, i| bits[i] == 1 }
        (msgs.size == 1) ? @wire.poll_reply(msgs.first, extra_headers) : @wire.poll_reply_many(msgs, extra_headers)
      end

      def allowed?(conn, msg)
        conn.client.allowed?(msg, @filters)
      rescue => e
        fail_connection(conn, e)
        false
      end

      # Moves the client's position past msg; true when the client may see it (check: false for a message
      # nobody is kept from: untargeted, no filters). A failing client message filter drops that one client
      # and never stops the fan-out.
      def take?(conn, msg, check: true)
        positions = conn.client.positions
        return false if msg.message_id <= (positions[msg.channel] || 0)
        positions[msg.channel] = msg.message_id
        !check || allowed?(conn, msg)
      end

      def deliver(conn, msgs)
        conn.deliver(msgs)
        remove(conn) unless conn.streaming?
        settle(conn)
      rescue => e
        fail_connection(conn, e)
      end

      def expire
        time = now
        while (conn = @timers.first) && conn.deadline <= time
          @timers.shift
          end_connection(conn) if conn.indexed # answered, superseded or gone ones have nothing left to end
        end
        # Answered polls wait here until their deadline; when they far outnumber parked clients, drop them.
        @timers.select!(&:indexed) if @timers.size > 2 * @clients.size + 1024
      end

      def end_connection(conn)
        remove(conn)
        conn.finish
        settle(conn)
      rescue => e
        fail_connection(conn, e)
      end

      def sweep_stalled
        time = now
        @writing.each_key do |conn|
          next unless conn.closed? || time - conn.stalled_since > @write_timeout
          conn.drop
        end
        @writing.delete_if { |conn, _| conn.closed? && remove(conn) }
      end

      # Forget a connection that is closed (or that the app server says is gone).
      def settle(conn, gone: false)
        conn.drop if gone
        return unless conn.closed?
        @writing.delete(conn)
        remove(conn)
      end

      # Forgets a connection (unindexes it); always true. gone: a key whose whole entry was dropped already
      # (#unindex), nothing to look up there.
      def remove(conn, gone = nil)
        return true unless conn.indexed
        conn.indexed = false
        client = conn.client
        @clients.delete(client.id) if @clients[client.id].equal?(conn)
        keys = client.keys
        return true if gone && keys.size == 1
        keys.each do |key|
          next if key == gone
          readers = @index[key] or next
          readers.delete(conn)
          @index.delete(key) if readers.empty?
        end
        true
      end

      def insert_timer(conn)
        deadline = conn.deadline
        at = (@timers.last.nil? || @timers.last.deadline <= deadline) ? @timers.size : @timers.bsearch_index { |c| c.deadline > deadline }
        @timers.insert(at, conn)
      end

      def fail_connection(conn, error)
        report(error)
        conn.drop
        settle(conn)
      rescue
        nil
      end

      def report(error)
        @on_error&.call(error)
      rescue
        nil
      end

      def shutdown
        @clients.values.each { |conn| end_connection(conn) }
        deadline = now + 1
        until @writing.empty? || now > deadline
          @selector.select(0.05) { |monitor| io_ready(monitor) }
        end
        @writing.each_key(&:drop)
        release_closed(force: true)
        @selector.close
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
