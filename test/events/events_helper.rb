# frozen_string_literal: true

require "test_helper"
require "stringio"
require "open3"

module Herald
  module EventsTestSupport
    UserRegistered = Struct.new(:user_id, keyword_init: true)
    PremiumRegistered = Class.new(UserRegistered)
    OrderPlaced = Struct.new(:order_id, :total)
    Numbered = Struct.new(:n)

    def setup
      Herald.reset!
      Events.registry.clear
      @tmp = Dir.mktmpdir("herald-events")
    end

    def teardown
      Herald.reset!
      Events.registry.clear
      FileUtils.rm_rf(@tmp) if @tmp
    end

    def use_store(store)
      Herald.configure { |c| c.store = store }
      store
    end

    def log_store(dir = File.join(@tmp, "log"), fsync: :never) = Store::Log.new(dir: dir, fsync: fsync)

    # A named subscriber class, built per test so the process-wide registry holds only this test's ones.
    # start: :oldest for a deferred one that must see what was published before its workers started.
    def define_subscriber(name, *targets, deferred: false, start: :now, retry_on: nil, &call)
      klass = Class.new { include Herald::Subscriber }
      klass.subscriber_name(name)
      klass.define_method(:call, &call)
      klass.retry_on(StandardError, **retry_on) if retry_on
      klass.deferred(start: start) if deferred
      klass.subscribe_to(*targets)
      klass
    end

    # Runs the block in a forked child; the child never returns into minitest.
    def fork_child
      fork do
        yield
        exit!(0)
      rescue Exception => e # standard:disable Lint/RescueException
        warn "child #{Process.pid} failed: #{e.class}: #{e.message}\n#{e.backtrace.first(8).join("\n")}"
        exit!(1)
      end
    end

    def read_ids(path) = File.exist?(path) ? File.read(path).split("\n").map { |l| Integer(l) } : []

    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # `exe/herald ARGS` in a child process: [stdout and stderr together, Process::Status].
    def herald(*args, env: {})
      Open3.capture2e(env, RbConfig.ruby, File.expand_path("../../exe/herald", __dir__), *args)
    end

    # Herald.logger's lines while the block runs (the logger is restored after). The block gets the
    # StringIO, to wait for lines that worker threads write.
    def capture_log
      io = StringIO.new
      previous = Herald.logger
      Herald.logger = ::Logger.new(io, formatter: proc { |sev, _, _, msg| "#{sev}: #{msg}\n" })
      yield io
      io.string
    ensure
      Herald.logger = previous
    end
  end
end
