# frozen_string_literal: true

require_relative "events_helper"

class EventCodecTest < Minitest::Test
  include Herald::EventsTestSupport

  Codec = Herald::Codec::Event
  Point = Struct.new(:x, :y)

  def roundtrip(obj) = Codec.decode(Codec.encode(obj))

  def test_keyword_init_and_positional_structs_come_back_as_themselves
    assert_equal UserRegistered.new(user_id: 7), roundtrip(UserRegistered.new(user_id: 7))
    assert_equal OrderPlaced.new(3, 9.5), roundtrip(OrderPlaced.new(3, 9.5))
    assert_instance_of PremiumRegistered, roundtrip(PremiumRegistered.new(user_id: 1))
  end

  def test_hashes_nested_structs_symbols_times_and_nils
    event = {"user" => Point.new(nil, [1, :two, Point.new("x", nil)]), "at" => Time.at(1_700_000_000, 123_456, :usec)}
    assert_equal event, roundtrip(event)
  end

  def test_decoded_values_are_frozen_facts
    event = roundtrip({"tags" => ["a"]})
    assert event.frozen?
    assert event["tags"].first.frozen?
  end

  def test_unknown_class_is_a_named_error_that_says_what_to_do
    bytes = Codec.encode(Point.new(1, 2)).sub("EventCodecTest::Point", "EventCodecTest::Poinx")
    error = assert_raises(Herald::UnknownEventClassError) { Codec.decode(bytes) }
    assert_match(/EventCodecTest::Poinx is not loaded.*require/, error.message)
  end

  def test_objects_it_cannot_carry_raise_a_named_error
    assert_raises(Herald::EventEncodingError) { Codec.encode(Object.new) }
    assert_raises(Herald::EventEncodingError) { Codec.encode(Struct.new(:a).new(1)) }
    assert_equal({"ok" => 1}, roundtrip({"ok" => 1}), "the thread's packer is usable after a failure")
  end

  def test_the_log_store_gives_events_back_by_codec_id
    store = log_store
    store.append("/events/x", Codec.encode(OrderPlaced.new(1, 2)), codec: Codec)
    store.close
    reopened = log_store
    assert_equal OrderPlaced.new(1, 2), reopened.global_backlog(0).first.data
  ensure
    reopened&.close
  end

  def test_allocations_per_roundtrip_stay_small
    event = UserRegistered.new(user_id: 1)
    bytes = Codec.encode(event)
    Codec.decode(bytes)
    before = GC.stat(:total_allocated_objects)
    100.times { Codec.decode(Codec.encode(event)) }
    assert_operator (GC.stat(:total_allocated_objects) - before) / 100.0, :<=, 6
  end
end
