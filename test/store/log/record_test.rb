# frozen_string_literal: true

require_relative "../../test_helper"

# Record.encode builds a frame with one pack into a reused buffer (cut back with "@0", not cleared) and
# patches its CRC in: the bytes must be the documented layout whatever came before in the buffer.
class LogRecordTest < Minitest::Test
  Record = Herald::Store::Log::Record

  # The layout of record.rb's comment, built independently of encode.
  def expected(gid, mid, channel, site_id, payload, codec_id, at, targets, max_size, max_age)
    site = site_id.to_s.b
    packed = targets ? MessagePack.pack(targets) : "".b
    flags = ((max_size || max_age) ? 1 : 0) | (site_id ? 2 : 0)
    word = codec_id | (flags << 8) | (channel.bytesize << 16) | (site.bytesize << 32) | ([packed.bytesize, 0xffff].min << 48)
    body = [gid, mid, word, packed.bytesize, at, max_size || 0, max_age || 0.0].pack("Q<Q<Q<L<EL<E") +
      channel.b + site + packed + payload.b
    [body.bytesize, Zlib.crc32(body)].pack("L<L<") + body
  end

  def test_frames_match_the_layout_in_a_reused_buffer
    seed = Integer(ENV.fetch("SEED", rand(1 << 30)))
    puts "SEED=#{seed}" if ENV["VERBOSE"]
    random = Random.new(seed)
    texts = ["", "/a", "/é/😀", "\0\xFF".b, "x" * 300, "é" * 5000]
    buffer = String.new(encoding: Encoding::BINARY)
    300.times do
      args = [random.rand(1 << 62), random.rand(1 << 40), texts.sample(random: random)[0, 1000],
        [nil, "", "sité"].sample(random: random), (texts + [MessagePack.pack(["é", 1])]).sample(random: random),
        random.rand(1..2), random.rand * 1e9, [nil, [[1, "é"], nil, ["c"]], [["x" * 70_000], nil, nil]].sample(random: random),
        [nil, 5].sample(random: random), [nil, 2.5].sample(random: random)]
      frame = Record.encode(buffer, *args)
      assert_same buffer, frame
      assert_equal expected(*args), frame, "SEED=#{seed}"
      assert_equal frame.bytesize - Record::FRAME_SIZE, Record.check(frame, 0, frame.bytesize)
      msg = Record.decode(frame, 0, frame.bytesize - Record::FRAME_SIZE)
      assert_equal [args[0], args[1], args[2].b, args[4].b], [msg.global_id, msg.message_id, msg.channel.b, msg.payload.b]
    end
  end

  # Records without site and targets are built from their channel's constant parts: the same bytes.
  def test_constant_parts_give_the_same_frames
    seed = Integer(ENV.fetch("SEED", rand(1 << 30)))
    random = Random.new(seed)
    buffer = String.new(encoding: Encoding::BINARY)
    300.times do
      channel = ["/a", "/é/😀", "\0\xFF".b, "c" * 1000, ""].sample(random: random)
      codec_id = random.rand(1..2)
      max_size = [nil, 1, 2**31].sample(random: random)
      max_age = [nil, 0.5, 86_400.0].sample(random: random)
      payload = ["", "{}", "é" * 3000, MessagePack.pack("\xFF".b)].sample(random: random)
      gid = random.rand(1 << 62)
      at = random.rand * 1e9
      head, tail = Record.constant_parts(channel, codec_id, max_size, max_age)
      frame = Record.encode_constant(buffer, gid, 7, at, head, tail, payload)
      assert_equal expected(gid, 7, channel, nil, payload, codec_id, at, nil, max_size, max_age), frame, "SEED=#{seed}"
      assert_equal Record.encode(String.new(encoding: Encoding::BINARY), gid, 7, channel, nil, payload, codec_id, at, nil, max_size, max_age), frame
    end
    assert_raises(Herald::InvalidMessageError) { Record.constant_parts("c" * 0x10000, 1, nil, nil) }
  end

  # Issue 23, defect 2: a 260 MiB record was written, then read as damage (its length is over MAX_PAYLOAD).
  # Publish now refuses data and targets beyond Store::Limits; the largest record they allow (and names
  # shorter than 64 KiB, Record.encode's own check) must still be a record to a reader, never :bad.
  def test_the_largest_record_publish_allows_is_read_as_a_record
    limits = Herald::Store::Limits
    largest = Record::HEADER_SIZE + 2 * 0xffff + limits::MAX_TARGETS_BYTES + limits::MAX_PAYLOAD_BYTES
    assert_operator largest, :<=, Record::MAX_PAYLOAD
    # The length word alone decides (the CRC comes after): a frame this long is waited for, one longer is damage.
    [[largest, :partial], [Record::MAX_PAYLOAD, :partial], [Record::MAX_PAYLOAD + 1, :bad]].each do |length, seen|
      frame = [length, 0].pack("L<L<") + "\0".b * 64
      assert_equal seen, Record.check(frame, 0, frame.bytesize), length.to_s
    end
  end

  # A buffer that shares its bytes (a dup, a slice to its end) cannot be cut back by "@0": it is cleared.
  def test_a_shared_buffer_is_cleared_and_a_frozen_one_refused
    buffer = String.new(encoding: Encoding::BINARY)
    args = [7, 3, "/c", nil, "{}", 1, 1.5, nil, nil, nil]
    Record.encode(buffer, 8, 4, "/longer-channel-name", "site", "x" * 100, 1, 1.5, nil, nil, nil)
    copy = buffer.dup
    tail = buffer.byteslice(10..)
    assert_equal expected(*args), Record.encode(buffer, *args)
    assert_equal expected(8, 4, "/longer-channel-name", "site", "x" * 100, 1, 1.5, nil, nil, nil), copy
    assert_equal copy.byteslice(10..), tail
    assert_raises(FrozenError) { Record.encode(buffer.freeze, *args) }
  end
end
