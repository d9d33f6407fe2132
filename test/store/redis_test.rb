# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"
require_relative "contract"
require_relative "networked_contract"

class RedisStoreTest < Minitest::Test
  include StoreContract
  include NetworkedStoreContract

  def setup
    Herald::TestServers.require!(self, :redis)
    super
  end

  def build_store(**options)
    Herald::Store::Redis.new(url: url, namespace: "t#{SecureRandom.hex(6)}", on_reset: ->(*) {}, **options)
  end

  def twin_store(store, **options)
    Herald::Store::Redis.new(url: url, namespace: store.namespace, **options).tap { |s| @stores << s }
  end

  def url = Herald::TestServers.redis_url

  # A restart without persistence: the backlog and every counter are gone.
  def disrupt!
    if Herald::TestServers.spawned_redis?
      Herald::TestServers.restart_redis!
    else
      redis = RedisClient.new(url: url)
      keys = redis.call("KEYS", "#{@store.namespace}:*")
      redis.call("DEL", *keys) unless keys.empty?
      redis.call("CLIENT", "KILL", "TYPE", "pubsub")
    end
  end

  def test_reader_survives_a_redis_restart_without_duplicates_and_reports_the_reset
    assert_reader_survives_disruption(expect_reset: true)
    assert_operator @store.last_id("/d"), :>, 20, "channel ids restart above the old ones"
  end

  def test_flush_is_detected_and_ids_never_go_backwards
    resets = []
    s = store(on_reset: ->(old, new) { resets << [old, new] })
    first = append("/a", 1, store: s)
    epoch = s.epoch
    RedisClient.new(url: url).call("DEL", "#{s.namespace}:meta", "#{s.namespace}:ids")
    second = append("/a", 2, store: s)
    assert_operator second.global_id, :>, first.global_id
    assert_operator second.message_id, :>, first.message_id
    assert_equal [[epoch, s.epoch]], resets
    refute_equal epoch, s.epoch
  end

  # APPEND answers with the epoch only when it is not the one the caller sent: a publisher whose store
  # was reset and recovered by another process learns the new epoch from its next publish (and tells
  # on_reset), single and batched.
  def test_a_publisher_learns_of_a_recovery_made_by_another_process
    resets = []
    s = store(on_reset: ->(old, new) { resets << [old, new] })
    other = twin_store(s, on_reset: ->(*) {})
    first = append("/a", 1, store: s)
    append("/a", 2, store: other)
    old = s.epoch
    RedisClient.new(url: url).then { |r| r.call("DEL", "#{s.namespace}:meta", "#{s.namespace}:ids").tap { r.close } }
    recovered = append("/a", 3, store: other)
    refute_equal old, other.epoch
    third = append("/a", 4, store: s)
    assert_equal [[old, other.epoch]], resets
    assert_equal other.epoch, s.epoch
    assert_operator third.global_id, :>, recovered.global_id
    assert_operator third.message_id, :>, recovered.message_id
    assert_operator recovered.message_id, :>, first.message_id
    RedisClient.new(url: url).then { |r| r.call("DEL", "#{s.namespace}:meta", "#{s.namespace}:ids").tap { r.close } }
    append("/a", 5, store: other)
    ids = append_batch(s, [["/a", "x"], ["/b", "y"]])
    assert_equal 2, resets.size
    assert_equal other.epoch, s.epoch
    assert_equal [ids[0][0], ids[0][0] + 1], ids.map(&:first)
    assert_equal %w[x], s.backlog("/a", ids[0][1] - 1).map(&:data)
  end

  # A read that began before another thread saw a reset must not bring the old epoch back. Here the
  # other thread's publish (which recovers the flushed store) runs at the moment the reader's reply,
  # taken before the flush, is being recorded: where a thread switch can put it. Before: the reader
  # set the old epoch again and called on_reset(new, old); the next publish called on_reset(old, new).
  def test_a_read_from_before_a_reset_does_not_bring_the_old_epoch_back
    resets = []
    s = store(on_reset: ->(old, new) { resets << [old, new] })
    append("/a", 1, store: s)
    old = s.epoch
    namespace = s.namespace
    injected = false
    publish = -> { append("/a", 2, store: s) }
    s.singleton_class.prepend(Module.new do
      define_method(:saw) do |epoch, gid, reset, *known|
        unless injected
          injected = true
          RedisClient.new(url: Herald::TestServers.redis_url).then { |r| r.call("DEL", "#{namespace}:meta", "#{namespace}:ids").tap { r.close } }
          Thread.new { publish.call }.join # another thread's publish: recovers
        end
        super(epoch, gid, reset, *known)
      end
    end)
    s.last_global_id # read before the flush, recorded after the other thread's recovery
    new = s.epoch
    refute_equal old, new
    append("/a", 3, store: s)
    assert_equal [[old, new]], resets
    assert_equal new, s.epoch
  end

  def test_a_read_only_replica_is_a_named_error
    replica = Herald::TestServers.redis_replica_url
    s = Herald::Store::Redis.new(url: replica, namespace: "ro")
    error = assert_raises(Herald::ReplicaReadOnlyError) { append("/a", 1, store: s) }
    assert_match(/primary/, error.message)
    assert_kind_of Herald::ReadOnlyError, error
  ensure
    s&.close
  end

  # Found by the model test: the channel's key lived by TTL, which Redis rounds to whole seconds, so a
  # publish 0.3 s after another kept the first one's expiry and its message went ~0.7 s early.
  def test_a_short_max_backlog_age_keeps_each_message_its_whole_age
    append("/short", "first", max_backlog_age: 1)
    sleep 0.3
    append("/short", "second", max_backlog_age: 1)
    sleep 0.8
    assert_equal ["second"], @store.backlog("/short", 0).map(&:data)
  end

  def evalsha_calls(redis)
    redis.call("INFO", "commandstats")[/cmdstat_evalsha:calls=(\d+)/, 1].to_i
  end

  # Concurrent publishes of one process share script calls (Redis::Batcher); ids stay dense per channel
  # and unique globally, and every thread gets its own record's ids back.
  def test_concurrent_publishes_share_script_calls
    redis = RedisClient.new(url: url)
    append("/warm", 0) # loads the script: the count below is EVALSHA calls only
    before = evalsha_calls(redis)
    results = Array.new(8) do |t|
      Thread.new { Array.new(150) { |i| [t, i, append("/t#{t % 3}", "#{t} #{i} é🎉")] } }
    end.flat_map(&:value)
    calls = evalsha_calls(redis) - before
    # A leader gathers the publishers of its last batch (Batcher::GATHER): about 7 records a call at 8
    # threads (with two calls in flight it was about two: 530 calls).
    assert_operator calls, :<, results.size * 0.25, "#{calls} script calls for #{results.size} concurrent publishes"
    assert_equal results.size, results.map { |*, m| m.global_id }.uniq.size
    results.group_by { |*, m| m.channel }.each do |channel, published|
      assert_equal (1..published.size).to_a, published.map { |*, m| m.message_id }.sort, channel
      stored = @store.backlog(channel, 0).to_h { |m| [m.message_id, m.data] }
      published.each { |t, i, m| assert_equal "#{t} #{i} é🎉", stored.fetch(m.message_id) }
    end
  ensure
    redis&.close
  end

  # Commands run by the server (scripts' inner calls included) since `before`, by name.
  def command_calls(redis, before = {})
    redis.call("INFO", "commandstats").scan(/^cmdstat_(\w+):calls=(\d+)/).to_h { |name, calls| [name, calls.to_i - before.fetch(name, 0)] }
  end

  # Requests as `append` makes them, for one script call carrying them all (what Batcher does for
  # concurrent publishes, without the timing).
  def append_batch(store, messages)
    codec = json_codec
    requests = messages.map do |channel, data, size, age|
      store.send(:request, channel, codec.encode(data), codec, Process.clock_gettime(Process::CLOCK_REALTIME), Herald::Store::Limits::EMPTY, nil, size, age)
    end
    store.send(:append_batch, requests)
  end

  # A shared script call stores a channel's records with one ZADD, all their references with one more,
  # hands out a channel's ids with one HINCRBY (and the global ids with one more, no HSET) and checks its
  # expiry once: the server's work grows with the channels in a batch, not with its records. (It ran
  # five commands per record.)
  def test_a_shared_script_call_does_the_servers_work_per_channel
    redis = RedisClient.new(url: url)
    append("/c0", "first")
    texts = Array.new(12) { |i| "#{i} é🎉\u0000" }
    before = command_calls(redis)
    ids = append_batch(@store, texts.each_with_index.map { |t, i| ["/c#{i % 2}", t] })
    calls = command_calls(redis, before)
    assert_equal 1, calls["evalsha"]
    assert_equal 3, calls["zadd"], calls.inspect
    assert_equal 3, calls["hincrby"], calls.inspect # one per channel, one for the global ids
    assert_equal 0, calls["hset"], calls.inspect
    assert_equal 1, calls["hmget"], calls.inspect
    assert_equal 1, calls["pttl"], calls.inspect # /c0's set was checked by its first publish
    assert_equal 2, calls["publish"], calls.inspect
    assert_equal (2..7).to_a, ids.each_slice(2).map(&:first).map(&:last)
    assert_equal (1..6).to_a, ids.each_slice(2).map(&:last).map(&:last)
    assert_equal (ids[0][0]..ids[0][0] + 11).to_a, ids.map(&:first)
    assert_equal ["first"] + texts.each_slice(2).map(&:first), @store.backlog("/c0", 0).map(&:data)
    assert_equal texts.each_slice(2).map(&:last), @store.backlog("/c1", 0).map(&:data)
    assert_equal ["first"] + texts, @store.global_backlog(0).map(&:data)
  ensure
    redis&.close
  end

  # A channel trim removes the trimmed records' global references by id arithmetic: it reads the
  # lowest record only (it read every trimmed record back: a tenth of the server's work per publish),
  # and the global set keeps references to live records only. Across a reset (ids jump) the trim
  # leaves the old references, which global reads skip.
  def test_a_channel_trim_removes_its_references_reading_one_record
    s = store(max_backlog_size: 16)
    redis = RedisClient.new(url: url)
    refs = "#{s.namespace}:refs"
    before = command_calls(redis)
    published = Array.new(50) { |i| append("/trim", "#{i} é🎉\u0000", store: s) }
    calls = command_calls(redis, before)
    assert_operator calls["zremrangebyscore"], :>=, 2, calls.inspect
    assert_equal calls["zremrangebyscore"], calls["zrange"], "one ZRANGE (of the lowest record) per trim"
    assert_equal calls["zremrangebyscore"], calls["zcard"], "and one ZCARD (are the ids dense?)"
    kept = published.last(16).map(&:global_id)
    assert_equal kept, s.backlog("/trim", 0).map(&:global_id)
    assert_equal kept, s.global_backlog(0).map(&:global_id)
    assert_equal redis.call("ZCARD", "#{s.namespace}:ch:/trim"), redis.call("ZCARD", refs), "no reference outlives its record"
    assert_equal (0..49).map { |i| "#{i} é🎉\u0000" }.last(16), s.global_backlog(published[10].global_id).map(&:data)
    redis.call("DEL", "#{s.namespace}:meta", "#{s.namespace}:ids") # a reset: the next ids jump
    after = Array.new(20) { |i| append("/trim", "after #{i}", store: s) }
    assert_equal (4..19).map { |i| "after #{i}" }, s.backlog("/trim", 0).map(&:data)
    assert_equal after.last(16).map(&:global_id), s.global_backlog(0).map(&:global_id)
  ensure
    redis&.close
  end

  # Each record of a shared call is trimmed and kept alive by its own retention (the script reads the
  # i-th record's from the packed numbers).
  def test_each_record_of_a_shared_call_keeps_its_own_retention
    redis = RedisClient.new(url: url)
    messages = Array.new(30) { |i| i.even? ? ["/four", "#{i} ☃", 4, 100] : ["/eight", "#{i} 🎉\u0000", 8, 5000] }
    append_batch(@store, messages)
    assert_equal 4, redis.call("ZCARD", "#{@store.namespace}:ch:/four")
    assert_equal 8, redis.call("ZCARD", "#{@store.namespace}:ch:/eight")
    assert_equal messages.select { |c, *| c == "/four" }.last(4).map { |m| m[1] }, @store.backlog("/four", 0).map(&:data)
    assert_equal messages.select { |c, *| c == "/eight" }.last(8).map { |m| m[1] }, @store.backlog("/eight", 0).map(&:data)
    assert_operator redis.call("PTTL", "#{@store.namespace}:ch:/four"), :<=, 100_000 * 17 / 16
    assert_operator redis.call("PTTL", "#{@store.namespace}:ch:/eight"), :>, 4_900_000
  ensure
    redis&.close
  end

  # After a reset a batch's channel ids restart above the floor together, in order.
  def test_a_batch_after_a_reset_gets_ids_above_the_old_ones
    3.times { |i| append("/r", i) }
    RedisClient.new(url: url).then { |r| r.call("DEL", "#{@store.namespace}:meta", "#{@store.namespace}:ids").tap { r.close } }
    ids = append_batch(@store, [["/r", "a"], ["/r", "b"], ["/other", "c"], ["/r", "d"]])
    mids = ids.map(&:last)
    assert_operator mids[0], :>, 3
    assert_equal [mids[0], mids[0] + 1, mids[0] + 2], mids.values_at(0, 1, 3)
    assert_equal mids[3], @store.last_id("/r")
    assert_equal %w[a b d], @store.backlog("/r", 3).map(&:data)
  end

  # The channel set's expiry is pushed past the newest record's with a margin, so a stream of publishes
  # does not set it again every time (it did: a PEXPIRE per publish), and it still outlives every record.
  def test_the_channel_expiry_is_not_set_on_every_publish
    redis = RedisClient.new(url: url)
    before = command_calls(redis)
    20.times { |i| append("/ttl", i, max_backlog_age: 100) }
    calls = command_calls(redis, before)
    assert_operator calls["pexpire"], :<=, 2, calls.inspect
    ttl = redis.call("PTTL", "#{@store.namespace}:ch:/ttl")
    assert_operator ttl, :>, 99_000
    assert_operator ttl, :<=, 100_000 + 100_000 / 16
  ensure
    redis&.close
  end

  # A process asks the script to check a set's expiry (PTTL) only when the last check it made does not
  # cover the new record (it did on every publish), and whenever the set may be new to it: a longer
  # age, a set that expired, a set flushed and recovered by another process.
  def test_the_channel_expiry_is_checked_only_when_the_last_check_does_not_cover_the_record
    redis = RedisClient.new(url: url)
    ttl = -> { redis.call("PTTL", "#{@store.namespace}:ch:/x") }
    before = command_calls(redis)
    20.times { |i| append("/x", "#{i} é🎉", max_backlog_age: 100) }
    assert_equal 1, command_calls(redis, before)["pttl"]
    assert_operator ttl.call, :>, 100_000
    append("/x", "longer", max_backlog_age: 1000)
    assert_operator ttl.call, :>, 1_000_000
    append("/short", "a", max_backlog_age: 1)
    sleep 1.2 # the set expires (1 s + 1/16)
    assert_equal 0, redis.call("EXISTS", "#{@store.namespace}:ch:/short")
    append("/short", "b", max_backlog_age: 1)
    assert_operator redis.call("PTTL", "#{@store.namespace}:ch:/short"), :>, 900
    other = twin_store(@store, on_reset: ->(*) {})
    append("/y", 1, store: other)
    append("/x", "before the flush")
    redis.call("DEL", "#{@store.namespace}:meta", "#{@store.namespace}:ids", "#{@store.namespace}:ch:/x")
    append("/y", 2, store: other) # recovers: a new epoch
    append("/x", "after")
    assert_operator ttl.call, :>, 1_000_000, "the set made after the flush has an expiry"
    assert_equal ["after"], @store.backlog("/x", 0).map(&:data)
  ensure
    redis&.close
  end

  # The record is kept once, in its channel's set; the global set holds a short reference to it.
  def test_a_record_is_stored_once
    big = "x" * 100_000
    append("/big", big)
    redis = RedisClient.new(url: url)
    keys = redis.call("KEYS", "#{@store.namespace}:*")
    sizes = keys.to_h { |k| [k, redis.call("MEMORY", "USAGE", k)] }
    assert_equal 1, sizes.count { |_, bytes| bytes > 100_000 }, sizes.inspect
    assert_equal [big], @store.global_backlog(0).map(&:data)
  ensure
    redis&.close
  end

  # References to records that are gone (their channel's set expired) are skipped, also across pages
  # and with a limit.
  def test_the_global_backlog_skips_records_whose_channel_expired
    3.times { |i| append("/gone", i) }
    kept = Array.new(Herald::Store::Redis::GLOBAL_PAGE + 5) { |i| append("/kept", i).global_id }
    RedisClient.new(url: url).then { |r| r.call("DEL", "#{@store.namespace}:ch:/gone").tap { r.close } }
    assert_equal kept, @store.global_backlog(0).map(&:global_id)
    assert_equal kept.first(2), @store.global_backlog(0, limit: 2).map(&:global_id)
    assert_equal kept.last(3), @store.global_backlog(kept[-4], limit: 10).map(&:global_id)
  end

  # The store's command builder passes flat all-String commands through as they are (the publish builds
  # its arguments so) and leaves anything else to redis-client's.
  def test_commands_pass_strings_through_and_convert_the_rest
    strings = ["EVALSHA", "é🎉\u0000", "".b]
    assert_same strings, Herald::Store::Redis::Commands.generate(strings)
    assert_equal ["SET", "k", "1", "PX", "2.5"], Herald::Store::Redis::Commands.generate(["SET", "k", 1, :PX, 2.5])
    assert_equal ["SET", "k", "v", "nx"], Herald::Store::Redis::Commands.generate(["SET", "k", "v"], {nx: true})
  end

  def test_store_from_url
    s = Herald::Store.from_url(url)
    assert_instance_of Herald::Store::Redis, s
    s.close
  end
end
