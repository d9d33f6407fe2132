# frozen_string_literal: true

require "json"
require "set"
require "logger"

module Herald
  # One fault-injection run against a real Redis or PostgreSQL (issue 14). Publisher processes (threads in
  # each) publish numbered messages to one channel and report every acknowledgement; subscriber processes
  # report every delivery and every on_reset, and read backlogs (cached) in a loop, timing each call. In
  # the middle the test injects its fault (a kill, a restart, a stall, a flush). Afterwards it counts, per run:
  #
  #   acked       publishes that returned an id
  #   lost        acked messages a fresh reader cannot find once the server is back (lost_after: of those
  #               acknowledged after the fault ended, which must be none)
  #   duplicated  deliveries of one message twice to one subscriber
  #   skipped     acked messages a live subscriber never got, though no on_reset told it of a loss
  #   covered     acked messages a subscriber never got, published before its on_reset told it of a reset
  #   longest     the longest publish and backlog/last_id call, in seconds
  #   foreign     exceptions that were not Herald::Error (must be none)
  #   disagree    subscribers whose cached backlog differs from an uncached read once settled
  class FaultRun
    CHANNEL = "/fault"
    PACE = 0.004 # seconds between one thread's publishes: enough traffic, little CPU on a shared machine
    Result = Struct.new(:store, :fault, :acked, :failed, :lost, :lost_after, :duplicated, :skipped, :covered,
      :resets, :longest_publish, :longest_read, :foreign, :disagree, :out_of_order, keyword_init: true)

    def self.now = Process.clock_gettime(Process::CLOCK_REALTIME)

    # build: ->(**options) { a new store instance on the run's data }; inject: -> { the fault } (blocking).
    def initialize(store:, fault:, build:, inject:, publishers: 2, threads: 2, subscribers: 2, seconds: 1.0, settle: 1.3)
      @store_name = store
      @fault = fault
      @build = build
      @inject = inject
      @publishers = publishers
      @threads = threads
      @subscribers = subscribers
      @seconds = seconds
      @settle = settle
      @lines = Hash.new { |h, k| h[k] = [] }
      @lock = Mutex.new
    end

    def run
      subs = Array.new(@subscribers) { |i| spawn_child("s#{i}") { |out, ctrl| subscriber(out, ctrl) } }
      wait_for(subs) { |name| @lines[name].any? { |l| l.start_with?("S") } }
      pubs = Array.new(@publishers) { |i| spawn_child("p#{i}") { |out, ctrl| publisher(i, out, ctrl) } }
      wait_for(pubs) { |name| acked_since?(name, 0) } # a loaded machine can take a while to get going
      sleep @seconds * 0.4
      @fault_started = FaultRun.now
      @inject.call
      @fault_ended = FaultRun.now
      wait_for(pubs) { |name| acked_since?(name, @fault_ended) }
      sleep @seconds * 0.6
      finish(pubs, "stop")
      sleep 0.5
      finish(subs, "check", timeout: @settle + 20)
      result
    ensure
      [*pubs, *subs].compact.each { |c| Process.kill(:KILL, c[:pid]) rescue nil } # standard:disable Style/RescueModifier
    end

    private

    def spawn_child(name)
      out_r, out_w = IO.pipe
      ctrl_r, ctrl_w = IO.pipe
      pid = fork do
        out_r.close
        ctrl_w.close
        Herald.logger = Logger.new(nil)
        out = Output.new(out_w)
        yield out, ctrl_r
        exit!(0)
      rescue Exception => e # standard:disable Lint/RescueException
        out_w.puts "X #{e.class} 0 child #{name} died: #{e.message[0, 200]}" rescue nil # standard:disable Style/RescueModifier
        exit!(1)
      end
      out_w.close
      ctrl_r.close
      reader = Thread.new { out_r.each_line { |l| @lock.synchronize { @lines[name] << l.chomp } } }
      {name: name, pid: pid, ctrl: ctrl_w, reader: reader}
    end

    # Pipe writes from several threads, each line whole.
    class Output
      def initialize(io)
        @io = io
        @io.sync = true
        @lock = Mutex.new
      end

      def <<(line) = @lock.synchronize { @io.puts(line) }
    end

    def acked_since?(name, time) = @lines[name].reverse_each.any? { |l| l.start_with?("A ") && l.split[4].to_f > time }

    def wait_for(children, timeout: 20)
      deadline = FaultRun.now + timeout
      children.each do |c|
        sleep 0.02 until @lock.synchronize { yield c[:name] } || FaultRun.now > deadline
      end
    end

    def finish(children, command, timeout: 20)
      children.each { |c| c[:ctrl].puts(command) rescue nil } # standard:disable Style/RescueModifier
      deadline = FaultRun.now + timeout
      children.each do |c|
        sleep 0.02 until Process.wait(c[:pid], Process::WNOHANG) || FaultRun.now > deadline
        next if c[:reader].join(2)
        Process.kill(:KILL, c[:pid]) rescue nil # standard:disable Style/RescueModifier
        @lock.synchronize { @lines[c[:name]] << "X Hung 0 #{c[:name]} did not finish" }
      end
    end

    def publisher(index, out, ctrl)
      bus = Herald::Bus.new(store: @build.call)
      stop = false
      threads = Array.new(@threads) do |t|
        Thread.new do
          seq = 0
          until stop
            tag = "#{index}.#{t}.#{seq += 1}"
            call(out, "A #{tag}", ->(m) { "#{m.global_id} #{m.message_id}" }) { bus.publish_message(CHANNEL, {"tag" => tag}) }
            sleep PACE
          end
        end
      end
      ctrl.gets
      stop = true
      threads.each(&:join)
    end

    # Times one call: "A tag ids start end" when it returned, "E class seconds" for a Herald::Error, "X" else.
    def call(out, label, describe = ->(r) { r })
      started = FaultRun.now
      result = yield
      out << "#{label} #{describe.call(result)} #{started} #{FaultRun.now}"
    rescue Herald::Error => e
      out << "E #{e.class} #{FaultRun.now - started}"
      sleep 0.02
    rescue => e
      out << "X #{e.class} #{FaultRun.now - started} #{e.message[0, 120].tr("\n", " ")}"
      sleep 0.02
    end

    def subscriber(out, ctrl)
      store = @build.call(on_reset: ->(_old, _new) { out << "R #{FaultRun.now}" })
      bus = Herald::Bus.new(store: store, on_error: ->(e, _m) { out << "X #{e.class} 0 dispatch: #{e.message[0, 120]}" unless e.is_a?(Herald::Error) })
      bus.subscribe(CHANNEL) { |m| out << "G #{m.data["tag"]} #{m.message_id} #{m.global_id}" }
      sleep 0.3 # the subscription goes live on the dispatcher thread
      out << "S"
      reading = true
      reader = Thread.new do
        while reading
          call(out, "B") { store.backlog(CHANNEL, 0).size }
          call(out, "L") { store.last_id(CHANNEL) }
          sleep 0.02
        end
      end
      ctrl.gets
      reading = false
      reader.join
      sleep @settle # the listener has heard of everything; the cache must agree with the server
      cached = store.backlog(CHANNEL, 0).map(&:global_id)
      fresh = @build.call(backlog_cache: false)
      out << "C #{cached == fresh.backlog(CHANNEL, 0).map(&:global_id)} #{cached.size}"
      bus.close
    end

    def result
      readable = Set.new(@build.call(backlog_cache: false).backlog(CHANNEL, 0).map { |m| m.data["tag"] })
      acks = pub_lines("A").map { |l| l.split }.to_h { |_, tag, _gid, _mid, started, ended| [tag, [started.to_f, ended.to_f]] }
      lost = acks.keys.reject { |tag| readable.include?(tag) }
      subs = @lines.keys.grep(/\As/).map { |name| subscriber_figures(name, acks) }
      Result.new(store: @store_name, fault: @fault, acked: acks.size, failed: pub_lines("E").size, lost: lost.size,
        lost_after: lost.count { |tag| acks[tag][0] > @fault_ended },
        duplicated: subs.sum { |s| s[:duplicated] }, skipped: subs.sum { |s| s[:skipped] }, covered: subs.sum { |s| s[:covered] },
        resets: subs.sum { |s| s[:resets] }, out_of_order: subs.sum { |s| s[:out_of_order] },
        longest_publish: longest(pub_lines("A"), pub_lines("E")), longest_read: longest(sub_lines("B") + sub_lines("L"), sub_lines("E")),
        foreign: all_lines("X"), disagree: @lines.keys.grep(/\As/).count { |n| @lines[n].grep(/\AC true /).empty? })
    end

    def subscriber_figures(name, acks)
      lines = @lines[name]
      got = lines.grep(/\AG /).map(&:split)
      tags = got.map { |g| g[1] }
      resets = lines.grep(/\AR /).map { |l| l.split[1].to_f }
      missing = acks.keys - tags
      covered = missing.count { |tag| resets.any? { |r| acks[tag][0] < r } }
      mids = got.map { |g| g[2].to_i }
      {duplicated: tags.size - tags.uniq.size, skipped: missing.size - covered, covered: covered, resets: resets.size,
       out_of_order: mids.each_cons(2).count { |a, b| b <= a }}
    end

    # A publish's duration from its timestamps, an error's from its third field.
    def longest(oks, errors)
      (oks.map { |l|
        f = l.split
        f[-1].to_f - f[-2].to_f
      } + errors.map { |l| l.split[2].to_f }).max || 0.0
    end

    def pub_lines(kind) = @lines.select { |n, _| n.start_with?("p") }.values.flatten.grep(/\A#{kind} /)

    def sub_lines(kind) = @lines.select { |n, _| n.start_with?("s") }.values.flatten.grep(/\A#{kind} /)

    def all_lines(kind) = @lines.values.flatten.grep(/\A#{kind} /)
  end
end
