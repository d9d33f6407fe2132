# frozen_string_literal: true

require_relative "test_helper"

class MessageTest < Minitest::Test
  # Counts decodes, to prove Message#data decodes lazily and once.
  module CountingCodec
    class << self
      attr_accessor :decodes
    end
    self.decodes = 0
    def self.decode(bytes)
      self.decodes += 1
      Herald::Codec::Json.decode(bytes)
    end
  end

  def build_message(payload = '{"a":1}', codec: CountingCodec)
    Herald::Message.new(global_id: 7, message_id: 3, channel: "/c", payload: payload, codec: codec, created_at: 1.5)
  end

  def test_data_is_decoded_lazily_and_once
    CountingCodec.decodes = 0
    msg = build_message
    assert_equal 0, CountingCodec.decodes
    assert_equal({"a" => 1}, msg.data)
    assert_same msg.data, msg.data
    assert_equal 1, CountingCodec.decodes
  end

  def test_null_data_is_cached_too
    CountingCodec.decodes = 0
    msg = build_message("null")
    assert_nil msg.data
    assert_nil msg.data
    assert_equal 1, CountingCodec.decodes
  end

  def test_readers_and_public
    msg = build_message
    assert_equal [7, 3, "/c", 1.5], [msg.global_id, msg.message_id, msg.channel, msg.created_at]
    assert msg.public?
    refute_respond_to msg, :data=
  end

  def test_codecs_round_trip_and_name_content_types
    obj = {"s" => "x", "n" => [1, nil, 2.5], "h" => {"k" => true}}
    [Herald::Codec::Json, Herald::Codec::Msgpack].each do |codec|
      bytes = codec.encode(obj)
      assert bytes.frozen?
      assert_equal obj, codec.decode(bytes)
      assert_same codec, Herald::Codec.fetch(codec.name)
      assert_same codec, Herald::Codec.fetch(codec.id)
    end
    assert_equal "application/json", Herald::Codec::Json.content_type
    assert_equal "application/vnd.msgpack", Herald::Codec::Msgpack.content_type
    assert_raises(Herald::CorruptRecordError) { Herald::Codec.fetch(99) }
  end
end
