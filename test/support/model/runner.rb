# frozen_string_literal: true

require "timeout"
require_relative "generator"
require_relative "compare"
require_relative "side"
require_relative "stores"

module Herald
  module Model
    # Runs one seed's operations against Store::Memory (the oracle) and one other store (the subject), each
    # behind a JSON and a MessagePack Herald::Bus, and compares every answer. Any difference raises Mismatch
    # with the seed and the command that replays it.
    #
    # Where stores may legitimately answer differently, the model says so here instead of comparing less:
    # - Age retention: a message expires at created_at + max_backlog_age, and each store takes its own
    #   created_at. A message whose expiry falls inside a read (between the oracle's and the subject's
    #   answers, with publish latency) may be in either answer; everything else must match exactly.
    # - Redis and PostgreSQL trim in batches (channel backlogs are read with LIMIT max_backlog_size, so they
    #   stay exact): a message that left its channel's backlog may stay in global_backlog until up to
    #   max_backlog_size/16 more are published on that channel.
    # - Other processes' messages reach a store when its wakeup delivers them: after a fork, the model waits
    #   for them with Store#wait, as any reader would. A forked child's publishes carry no per-publish
    #   retention: Redis and PostgreSQL remember it in the publishing process only (see Store::Redis).
    # - Subscriptions deliver asynchronously and skip what was trimmed before their dispatcher read it. When
    #   one is checked, a marker is published on its channel and awaited on both sides; then each side must
    #   have delivered, without duplicates and in order, every message on its channel that is still retained
    #   and that the other side delivered. (On a channel whose messages expire within seconds the marker
    #   may expire before it is delivered: then only what was delivered is checked.)
    class Runner
      include Compare

      Published = Struct.new(:message, :key, :p0, :p1, :age)
      Sub = Struct.new(:op, :started, :handles, :got, :lock)

      SHORT_AGE = 3600 # ages below this may expire during a run
      OP_TIMEOUT = 60
      FENCE_TIMEOUT = 15
      SIDES = %i[oracle subject].freeze

      attr_reader :seed, :store_name, :ops_run

      def self.slashless?
        return @slashless unless @slashless.nil?
        @slashless = begin
          Bus.new(store: Store::Memory.new).publish("model", 1).positive?
        rescue Herald::Error
          false
        end
      end

      def initialize(store_name, seed:, ops:)
        @store_name = store_name
        @seed = seed
        @ops = ops
        config = Random.new(seed ^ 0x5eed)
        @size = [3, 8, 20, 60, 1000][config.rand(5)]
        @segment_bytes = [4096, 65_536, 1 << 20, 64 << 20][config.rand(4)]
        # Half the seeds give both stores a low max_payload_bytes, and publish data at it and one byte over.
        max = Store::Limits::MAX_PAYLOAD_BYTES
        @payload_limit = [max, max, 4096 + config.rand(64), 65_536, 1 << 20][config.rand(5)]
        @generator = Generator.new(seed, slashless: Runner.slashless?, payload_limit: @payload_limit)
        @subject_def = Subject.new(store_name, max_backlog_size: @size, segment_bytes: @segment_bytes, max_payload_bytes: @payload_limit)
        @published = {} # global id => Published (from the oracle)
        @by_key = {} # [channel, site_id] => [Published]
        @ages = {} # key => its max_backlog_age
        @max_sizes = Hash.new(@size) # key => the largest max_backlog_size it had
        @subs = {}
        @data_checked = Set.new
        @ops_run = 0
        @index = 0
      end

      def replay_command
        "SEED=#{@seed} STORE=#{@store_name} OPS=#{@ops} bundle exec ruby -Itest test/store/model_test.rb"
      end

      def run
        @oracle = Side.new(Store::Memory.new(max_backlog_size: @size, max_payload_bytes: @payload_limit))
        @subject = Side.new(@subject_def.build)
        @ops.times do |i|
          @index = i
          @op = @generator.next_op
          perform(@op)
          @ops_run += 1
        end
        @op = {op: :end}
        finish_all
        check_all("at the end")
        run_reopen(@op) if @subject_def.log?
        self
      ensure
        [@subject, @oracle].each { |side| side&.close rescue nil } # standard:disable Style/RescueModifier
        @subject_def.cleanup
      end

      private

      def perform(op)
        warn "#{@index + 1}: #{describe_op(op)}" if ENV["MODEL_TRACE"]
        Timeout.timeout(OP_TIMEOUT) { send(:"run_#{op[:op]}", op) }
        check_errors
      rescue Timeout::Error
        fail!("operation took longer than #{OP_TIMEOUT}s")
      rescue Mismatch
        raise
      rescue => e # outside what `attempt` compares: the model or a store broke
        fail!("#{e.class}: #{e.message}\n      #{e.backtrace&.first(8)&.join("\n      ")}")
      end

      def fail!(detail)
        errors = [@oracle, @subject].compact.flat_map(&:errors)
        detail = "#{detail}\n  (bus dispatchers reported: #{errors.first(3).join("; ")})" unless errors.empty?
        raise Mismatch, "model: #{@store_name} differs from the oracle (seed #{@seed}, operation #{@index + 1} of #{@ops}, " \
          "max_backlog_size #{@size}, segment_bytes #{@segment_bytes}, max_payload_bytes #{@payload_limit})\n  operation: #{describe_op(@op)}\n  #{detail}\n" \
          "  replay: #{replay_command}"
      end

      def describe_op(op)
        op.map { |k, v| "#{k}: #{(k == :publishes) ? v.map { |p| describe_op(p) }.inspect : show(v, 80)}" }.join(", ")
      end

      def check_errors
        SIDES.each do |name|
          side = instance_variable_get(:"@#{name}")
          fail!("#{name}'s bus dispatcher reported: #{side.errors.first(3).join("; ")}") unless side.errors.empty?
        end
      end

      def now = Process.clock_gettime(Process::CLOCK_REALTIME)

      def key_of(channel, site_id) = [channel, channel.start_with?(Bus::GLOBAL_PREFIX) ? nil : site_id]

      def publish_args(op)
        {user_ids: op[:user_ids], group_ids: op[:group_ids], client_ids: op[:client_ids], site_id: op[:site_id],
         max_backlog_size: op[:max_backlog_size], max_backlog_age: op[:max_backlog_age]}
      end

      def publish_on(side, op, args) = attempt { side.bus(op[:codec]).publish_message(op[:channel], op[:data], **args) }

      def run_publish(op)
        args = publish_args(op)
        t0 = now
        expected = publish_on(@oracle, op, args)
        actual = publish_on(@subject, op, args)
        t1 = now
        return unless same_outcome?("publish", expected, actual)
        record(expected[1], args, t0, t1)
        warn "  => #{expected[1].global_id}:#{expected[1].message_id}" if ENV["MODEL_TRACE"]
        fail!("the oracle's data is not what was published: #{show(expected[1].data)}") unless same?(op[:data], expected[1].data)
        compare_message("publish", expected[1], actual[1])
        expected[1]
      end

      def record(msg, args, p0, p1)
        key = [msg.channel, msg.site_id]
        # Each message keeps the max_backlog_age it was published with; a new one applies from then on.
        @ages[key] = args[:max_backlog_age] || @ages[key] || Store::DEFAULT_MAX_BACKLOG_AGE
        @max_sizes[key] = args[:max_backlog_size] if args[:max_backlog_size] && args[:max_backlog_size] > @max_sizes[key]
        published = Published.new(msg, key, p0, p1, @ages[key])
        @published[msg.global_id] = published
        (@by_key[key] ||= []) << published
      end

      # Published messages whose expiry may fall between t0 and t1.
      def expiring(records, t0, t1)
        records.each_with_object(Set.new) do |r, set|
          set << r.message.global_id if r.age < SHORT_AGE && r.p0 + r.age <= t1 + 0.01 && r.p1 + r.age > t0 - 0.01
        end
      end

      def read(what, &block)
        t0 = now
        expected = attempt { block.call(@oracle) }
        actual = attempt { block.call(@subject) }
        [same_outcome?(what, expected, actual) && expected[1], actual[1], t0, now]
      end

      def run_backlog(op)
        what = "backlog(#{show(op[:channel], 60)}, #{op[:last_id]}, site_id: #{show(op[:site_id], 40)})"
        expected, actual, t0, t1 = read(what) { |side| side.bus(op[:codec]).backlog(op[:channel], op[:last_id], site_id: op[:site_id]) }
        return unless expected
        records = @by_key.fetch(key_of(op[:channel], op[:site_id]), []).select { |r| r.message.message_id > op[:last_id] }
        compare_list(what, expected, actual, optional: expiring(records, t0, t1))
      end

      def run_global_backlog(op)
        what = "global_backlog(#{op[:last_id]}, limit: #{op[:limit].inspect})"
        expected, actual, t0, t1 = read(what) do |side|
          [side.bus(op[:codec]).global_backlog(op[:last_id]), side.bus(op[:codec]).global_backlog(op[:last_id], limit: op[:limit])]
        end
        return unless expected
        all, limited = expected
        records = @published.each_value.select { |r| r.message.global_id > op[:last_id] }
        optional = expiring(records, t0, t1)
        compare_list("the oracle's own #{what}", all, limited, optional: optional, limit: op[:limit])
        optional.merge(trimmed(records, all)) if @subject_def.networked?
        [[actual[0], nil], [actual[1], op[:limit]]].each do |act, limit|
          compare_list(what, all, act, optional: optional, limit: limit)
          check_trim_slack(what, act, all) if @subject_def.networked?
        end
      end

      # The networked stores' batched trim: messages the oracle no longer retains.
      def trimmed(records, retained)
        kept = retained.to_set(&:global_id)
        records.map { |r| r.message.global_id }.reject { |id| kept.include?(id) }
      end

      def check_trim_slack(what, actual, retained)
        kept = retained.to_set(&:global_id)
        actual.reject { |m| kept.include?(m.global_id) }.group_by { |m| [m.channel, m.site_id] }.each do |key, extra|
          expired = extra.count { |m| @published[m.global_id].age < SHORT_AGE }
          next if extra.size - expired <= @max_sizes[key] / 16
          fail!("#{what}: #{extra.size} messages of #{show(key)} beyond its backlog (batched trim allows #{@max_sizes[key] / 16})")
        end
      end

      def run_last_id(op)
        what = "last_id(#{show(op[:channel], 60)}, site_id: #{show(op[:site_id], 40)})"
        expected, actual, = read(what) { |side| side.bus(op[:codec]).last_id(op[:channel], site_id: op[:site_id]) }
        fail!("#{what}: oracle #{expected}, subject #{actual.inspect}") if expected && expected != actual
      end

      def run_last_ids(op)
        what = "last_ids(#{op[:channels].size} channels, site_id: #{show(op[:site_id], 40)})"
        expected, actual, = read(what) { |side| side.bus(op[:codec]).last_ids(*op[:channels], site_id: op[:site_id]) }
        fail!("#{what}: oracle #{show(expected, 600)}, subject #{show(actual, 600)}") if expected && !same?(expected, actual)
      end

      def run_sleep(op) = sleep(op[:seconds])
    end
  end
end

require_relative "runner_processes"
