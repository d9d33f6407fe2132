# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"

# The records a Redis wakeup carries (Scripts::APPEND, Redis::Announcements): a reader woken in another
# process takes them without a round trip, and gets exactly what global_backlog would have given.
class RedisAnnouncementsTest < Minitest::Test
  Announcements = Herald::Store::Redis::Announcements

  def setup
    Herald::TestServers.require!(self, :redis)
    @stores = []
  end

  def teardown
    @stores.each(&:close)
  end

  def store(namespace) = Herald::Store::Redis.new(url: Herald::TestServers.redis_url, namespace: namespace, on_reset: ->(*) {}).tap { @stores << _1 }

  def test_a_run_answers_only_when_it_is_gapless_up_to_the_latest_id
    run = Announcements.new
    run.add(10, "a")
    run.add(11, "b")
    assert_equal %w[a b], run.after(9, 11, nil)
    assert_equal %w[b], run.after(10, 11, nil)
    assert_equal %w[a], run.after(9, 11, 1)
    assert_nil run.after(8, 11, nil), "id 9 is not in the run"
    assert_nil run.after(9, 12, nil), "id 12 was announced without its record"
    assert_nil run.after(11, 11, nil), "nothing new: the reader reads the server"
    run.add(13, "d") # 12 came without a record: the run starts again
    assert_nil run.after(11, 13, nil)
    assert_equal %w[d], run.after(12, 13, nil)
    run.clear
    assert_nil run.after(12, 13, nil)
  end

  def test_a_run_keeps_the_newest_records
    run = Announcements.new
    (1..Announcements::MAX_RECORDS + 5).each { |id| run.add(id, id.to_s) }
    assert_nil run.after(0, Announcements::MAX_RECORDS + 5, nil)
    assert_equal %w[1029], run.after(1028, 1029, nil)
    assert_equal Announcements::MAX_RECORDS, run.after(5, Announcements::MAX_RECORDS + 5, nil).size
  end

  # Random channels (site ids, non-ASCII), payloads from empty to over ANNOUNCE_MAX, binary and UTF-8, from
  # a publisher store; a reader store waits and takes announced_backlog || global_backlog, as the ActionCable
  # listener does. Every announced answer equals global_backlog's for the same cursor and limit; the reader
  # gets every message once, in order.
  def test_a_woken_reader_gets_what_global_backlog_gives
    seed = Integer(ENV.fetch("SEED", Random.new_seed % 100_000))
    warn "#{self.class}##{name}: seed #{seed}"
    random = Random.new(seed)
    namespace = "ann#{SecureRandom.hex(4)}"
    reader = store(namespace)
    publisher = store(namespace)
    cursor = reader.last_global_id
    reader.wait(cursor, timeout: 0.2) # the listener is up
    sent = []
    publishing = Thread.new do
      200.times do
        channel = ["/chat", "/日本語 🎉", "/x\0y"].sample(random: random)
        size = [0, 1, 200, 5000, Herald::Store::Redis::Scripts::ANNOUNCE_MAX + 1, 40_000].sample(random: random)
        payload = random.bytes(size).then { |b| random.rand(2).zero? ? b : ("é" * (size / 2)) }
        site = [nil, "site-ü"].sample(random: random)
        sent << publisher.append(channel, payload, codec: Herald::Codec::Raw, site_id: site).global_id
        sleep(random.rand * 0.003)
      end
    end
    got = []
    announced = 0
    until got.size == 200
      reader.wait(cursor, timeout: 5)
      limit = [nil, 1, 3].sample(random: random)
      batch = reader.announced_backlog(cursor, limit: limit)
      read = reader.global_backlog(cursor, limit: limit)
      if batch
        announced += 1
        assert_equal facts(read.first(batch.size)), facts(batch), "seed #{seed}: announced after #{cursor}"
      end
      batch ||= read
      got.concat(batch)
      cursor = batch.last.global_id if batch.any?
    end
    publishing.join
    assert_equal sent, got.map(&:global_id), "seed #{seed}: every message once, in order"
    assert_equal facts(publisher.global_backlog(0).select { sent.include?(_1.global_id) }), facts(got)
    assert_operator announced, :>, 20, "seed #{seed}: the wakeups' records were used (#{announced} times)"
    warn "#{self.class}: #{announced} reads of #{got.size} messages answered from the wakeups"
  end

  def facts(messages) = messages.map { |m| [m.global_id, m.message_id, m.channel, m.site_id, m.payload.b, m.created_at] }
end
