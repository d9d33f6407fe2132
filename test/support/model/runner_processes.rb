# frozen_string_literal: true

module Herald
  module Model
    # The Runner's operations that involve threads, processes and restarts: subscriptions, fences, forked
    # publishers, reopening the store, and the full comparison of everything stored.
    class Runner
      private

      def run_subscribe(op)
        sub = Sub.new(op, now, {}, {oracle: [], subject: []}, Mutex.new)
        outcomes = SIDES.to_h do |name|
          side = instance_variable_get(:"@#{name}")
          [name, attempt { side.bus(op[:codec]).subscribe(op[:channel], op[:from], site_id: op[:site_id]) { |m| sub.lock.synchronize { sub.got[name] << m } } }]
        end
        return unless same_outcome?("subscribe", outcomes[:oracle], outcomes[:subject])
        SIDES.each { |name| sub.handles[name] = outcomes[name][1] }
        @subs[op[:number]] = sub
      end

      def run_finish(op)
        sub = @subs.delete(op[:number]) or return
        fenced = fence(sub)
        retained = @oracle.store.global_backlog(0).to_set(&:global_id)
        expiring = expiring(@published.each_value, sub.started, now)
        got = sub.lock.synchronize { sub.got.transform_values(&:dup) }
        SIDES.each { |name| check_delivered(sub, name, got[name]) }
        SIDES.each do |name|
          next unless fenced
          other = SIDES.find { |n| n != name }
          have = got[name].to_set(&:global_id)
          lost = got[other].find { |m| retained.include?(m.global_id) && !expiring.include?(m.global_id) && !have.include?(m.global_id) }
          if lost
            fail!("subscription #{op[:number]} (#{show(sub.op[:channel], 60)}, #{sub.op[:from].inspect}, site_id: " \
              "#{show(sub.op[:site_id], 40)}): the #{name} never delivered #{describe(lost)}, still retained\n" \
              "    oracle:  #{ids(got[:oracle])}\n    subject: #{ids(got[:subject])}")
          end
        end
      ensure
        sub&.handles&.each_value(&:unsubscribe)
      end

      def check_delivered(sub, name, messages)
        what = "subscription #{sub.op[:number]} on the #{name}"
        channel = sub.op[:channel]
        site = key_of(channel, sub.op[:site_id])[1]
        last = Hash.new(0)
        seen = Set.new
        messages.each do |m|
          fail!("#{what}: #{describe(m)} twice") unless seen.add?(m.global_id)
          on_channel = m.channel == channel && (site.nil? || m.site_id == site)
          fail!("#{what}: #{describe(m)} is not on its channel") unless on_channel
          key = [m.channel, m.site_id]
          fail!("#{what}: #{describe(m)} after message id #{last[key]}") unless m.message_id > last[key]
          ref = @published[m.global_id] or fail!("#{what}: #{describe(m)} was never published")
          # Without a site, a subscription also delivers what was published after it, whatever its id.
          early = sub.op[:from] && key == key_of(channel, sub.op[:site_id]) && m.message_id <= sub.op[:from]
          fail!("#{what}: #{describe(m)} is not after #{sub.op[:from]}") if early && (site || ref.p0 < sub.started)
          last[key] = m.message_id
          compare_message(what, ref.message, m)
        end
      end

      # Publishes markers on the subscription's own channel until one is past its starting id, and waits until
      # both sides delivered it: the subscription is then live and has handled everything before it. False
      # when the marker expired first (a channel with a short max_backlog_age): then only what was delivered
      # can be checked.
      def fence(sub)
        marker = nil
        64.times do
          marker = run_publish({op: :publish, codec: sub.op[:codec], channel: sub.op[:channel], site_id: sub.op[:site_id], data: "fence #{@index}"}) or return false
          break if sub.op[:from].nil? || marker.message_id > sub.op[:from] || key_of(sub.op[:channel], sub.op[:site_id])[1].nil?
        end
        record = @published[marker.global_id]
        deadline = now + FENCE_TIMEOUT
        until SIDES.all? { |name| sub.lock.synchronize { sub.got[name].any? { |m| m.global_id == marker.global_id } } }
          return false if record.age < SHORT_AGE && now > record.p0 + record.age
          fail!("subscription #{sub.op[:number]}: not both sides delivered #{describe(marker)} within #{FENCE_TIMEOUT}s") if now > deadline
          sleep 0.002
        end
        true
      end

      def finish_all
        @subs.keys.each { |number| run_finish({op: :finish, number: number}) }
      end

      def run_reopen(_op)
        finish_all
        return unless @subject_def.log?
        @subject.close
        @subject = Side.new(@subject_def.build)
        check_all("after reopening")
      end

      # A forked child publishes through the store it inherited; the parent then publishes the same on the
      # oracle and reads the child's messages from the subject. (Memory cannot be shared: it publishes here.)
      def run_fork(op)
        return op[:publishes].each { |p| run_publish(p) } unless @subject_def.forkable?
        t0 = now
        results = in_child { op[:publishes].map { |p| child_result(publish_on(@subject, p, publish_args(p))) } }
        op[:publishes].zip(results).each do |p, (status, *detail)|
          args = publish_args(p)
          expected = publish_on(@oracle, p, args)
          if status == :error || expected[0] == :error
            next if status == expected[0] && detail[0] == expected[1].class.name
            fail!("publish in a child: oracle #{outcome(expected)}, subject #{status} #{detail.inspect}")
          end
          record(expected[1], args, t0, now)
          fail!("publish in a child: oracle ids #{expected[1].global_id}/#{expected[1].message_id}, subject #{detail.inspect}") unless detail == [expected[1].global_id, expected[1].message_id]
        end
        catch_up_with_children
        op[:publishes].map { |p| [p[:channel], p[:site_id]] }.uniq.each do |channel, site|
          run_backlog({op: :backlog, codec: :json, channel: channel, site_id: site, last_id: 0})
        end
      end

      # A log directory wiped and recreated by another process, which publishes into the new one, while this
      # process holds the store open with readers: a subscription on every channel, a watcher and a waiter.
      # The subject must notice (a new epoch), its readers must be given the new directory's messages, and
      # from then on it must answer as a new oracle that saw only those publishes. Other stores: the
      # publishes only (a reset of Redis or PostgreSQL is another test's).
      def run_replace_dir(op)
        finish_all
        return op[:publishes].each { |p| run_publish(p) } unless @subject_def.log?
        store = @subject.store
        old_epoch = store.known_epoch
        readers = open_readers(store)
        results = in_child do
          FileUtils.rm_rf(store.dir)
          side = Side.new(@subject_def.build)
          op[:publishes].map { |p| child_result(publish_on(side, p, publish_args(p))) }.tap { side.close }
        end
        renew_oracle
        expected = op[:publishes].zip(results).filter_map do |p, (status, *detail)|
          args = publish_args(p)
          t0 = now
          outcome = publish_on(@oracle, p, args)
          fail!("publish into the new directory: oracle #{outcome(outcome)}, subject #{status} #{detail.inspect}") unless status == outcome[0]
          next if status == :error
          record(outcome[1], args, t0, now)
          fail!("publish into the new directory: oracle ids #{outcome[1].global_id}/#{outcome[1].message_id}, subject #{detail.inspect}") unless detail == [outcome[1].global_id, outcome[1].message_id]
          outcome[1]
        end
        check_readers(store, old_epoch, readers, expected)
        check_all("after the directory was replaced")
      end

      def open_readers(store)
        readers = {got: [], lock: Mutex.new, watched: 0}
        readers[:sub] = @subject.bus(:msgpack).subscribe { |m| readers[:lock].synchronize { readers[:got] << m } }
        readers[:watch] = store.watch { readers[:lock].synchronize { readers[:watched] += 1 } }
        from = store.last_global_id
        readers[:waiter] = Thread.new { store.wait(from, timeout: FENCE_TIMEOUT) }
        sleep 0.3 # the subscription goes live on the dispatcher's next round (Bus::WAIT_SLICE)
        readers
      end

      # The oracle of a store that was wiped: a new Memory store, and nothing published before.
      def renew_oracle
        @oracle.close
        @oracle = Side.new(Store::Memory.new(max_backlog_size: @size, max_payload_bytes: @payload_limit))
        @published = {}
        @by_key = {}
        @ages = {}
        @max_sizes = Hash.new(@size)
      end

      def check_readers(store, old_epoch, readers, expected)
        deadline = now + FENCE_TIMEOUT
        sleep 0.01 until store.known_epoch != old_epoch || now > deadline
        fail!("the subject kept epoch #{old_epoch} for #{FENCE_TIMEOUT}s after its directory was replaced") if store.known_epoch == old_epoch
        sleep 0.01 until readers[:lock].synchronize { readers[:got].size >= expected.size } || now > deadline
        got = readers[:lock].synchronize { readers[:got].dup }
        unless got.map(&:global_id) == expected.map(&:global_id)
          fail!("a subscription open across the replacement delivered #{ids(got)}, the new directory holds #{ids(expected)}")
        end
        got.zip(expected).each { |m, e| compare_message("delivery after the replacement", e, m) }
        fail!("a waiter in Store#wait was not woken by the replacement") unless readers[:waiter].join(FENCE_TIMEOUT)
        fail!("a watcher was not called by the replacement") if readers[:lock].synchronize { readers[:watched] }.zero?
      ensure
        readers[:sub].unsubscribe
        readers[:watch].cancel
      end

      def child_result(result) = (result[0] == :ok) ? [:ok, result[1].global_id, result[1].message_id] : [:error, result[1].class.name, result[1].message]

      def in_child
        reader, writer = IO.pipe
        pid = Process.fork do
          reader.close
          writer.write(Marshal.dump(yield))
          writer.close
          exit!(0)
        rescue Exception => e # standard:disable Lint/RescueException
          writer.write(Marshal.dump([:crashed, "#{e.class}: #{e.message}", e.backtrace&.first(8)]))
          exit!(1)
        end
        writer.close
        data = reader.read
        Process.wait(pid)
        result = Marshal.load(data)
        fail!("the child publisher crashed: #{result.inspect}") unless $?.success? && result.first != :crashed
        result
      ensure
        reader&.close
      end

      def catch_up_with_children
        target = @oracle.store.last_global_id
        deadline = now + FENCE_TIMEOUT
        until (seen = @subject.store.wait(target - 1, timeout: 1)) >= target
          fail!("the subject never saw the child's messages: last global id #{seen}, expected #{target}") if now > deadline
        end
      end

      # Every key's backlog, every site's last ids, and the global backlog.
      def check_all(moment)
        @op = {op: :check_all, moment: moment}
        @by_key.each_key do |channel, site|
          run_backlog({op: :backlog, codec: :msgpack, channel: channel, site_id: site, last_id: 0})
        end
        @by_key.keys.group_by(&:last).each do |site, keys|
          run_last_ids({op: :last_ids, codec: :json, channels: keys.map(&:first), site_id: site})
        end
        run_global_backlog({op: :global_backlog, codec: :json, last_id: 0, limit: nil})
      end
    end
  end
end
