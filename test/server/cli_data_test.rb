# frozen_string_literal: true

require "test_helper"
require "json"
require "fileutils"
require_relative "../support/herald_cli"

# Whatever a user types into `herald publish` comes back out of `herald tail`, byte for byte: accents,
# emoji and ZWJ sequences, CJK, U+0000, non-ASCII channel names, under a UTF-8 or a C locale.
class CLIDataTest < Minitest::Test
  include Herald::HeraldCLI

  # JSON texts in the form `tail` prints them (JSON.generate: UTF-8 as is, control characters escaped).
  TEXTS = [
    '{"text":"héllo 👋"}',
    '{"text":"nul\u0000in the middle","empty":""}',
    '{"family":"👨‍👩‍👧‍👦","flag":"🏳️‍🌈","skin":"👋🏽"}',
    '{"cjk":"漢字 かな カナ 한국어 中文","rtl":"שלום مرحبا"}',
    '"a bare string: ünïcödé"',
    '["\u0000",0,null,true,{"ключ":"значение"}]'
  ].freeze

  def setup
    @dir = Dir.mktmpdir("herald-cli-data")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_published_text_comes_back_from_tail_byte_for_byte
    ids = TEXTS.map { |json| herald_publish("/chat", json, dir: @dir) }
    assert_equal (1..TEXTS.size).to_a, ids
    assert_equal TEXTS, tail_lines("/chat", TEXTS.size)
  end

  def test_non_ascii_channel_names
    channels = ["/чат", "/日本語/チャンネル", "/emoji/👨‍👩‍👧", "/café"]
    channels.each_with_index { |ch, i| herald_publish(ch, %({"n":#{i},"ch":#{JSON.generate(ch)}}), dir: @dir) }
    tails = channels.map { |ch| Thread.new { tail_lines(ch, 1) } }
    channels.zip(tails).each_with_index do |(ch, tail), i|
      assert_equal [%({"n":#{i},"ch":#{JSON.generate(ch)}})], tail.value, ch
    end
  end

  # Under LANG=C Ruby tags arguments ASCII-8BIT: a channel named that way was a different Hash key from
  # the same name read back from the log.
  def test_a_c_locale_publishes_and_tails_the_same_channel
    c_locale = {"LC_ALL" => "C", "LANG" => "C"}
    herald_publish("/café", '{"text":"é under C"}', dir: @dir, env: c_locale)
    assert_equal ['{"text":"é under C"}'], tail_lines("/café", 1)
    assert_equal ['{"text":"é under C"}'], tail_lines("/café", 1, env: c_locale)
  end

  # Live delivery (no --from): wait until tail is listening, then every text arrives as it is published.
  def test_tail_prints_messages_as_they_are_published
    tail = Tail.new("/live", "--dir", @dir)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    n = 0
    until tail.gets(timeout: 0.3)
      herald_publish("/live", %({"warm-up":#{n += 1}}), dir: @dir)
      flunk "tail printed nothing in 60 s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
    TEXTS.each { |json| herald_publish("/live", json, dir: @dir) }
    lines = []
    while lines.size < TEXTS.size && (line = tail.gets)
      lines << line unless line.start_with?('{"warm-up":') # the warm-ups published after tail subscribed
    end
    assert_equal TEXTS.map(&:b), lines
  ensure
    status, err = tail&.stop
    assert_equal 0, status&.exitstatus, err
  end

  # Linux allows 128 KiB per argument: about 100 KiB of mixed text (bigger payloads: the store tests).
  def test_a_large_text_round_trips
    json = JSON.generate({"text" => "é👋漢\u0000" * 7_000})
    assert_operator json.bytesize, :>, 100_000
    herald_publish("/big", json, dir: @dir)
    assert_equal [json], tail_lines("/big", 1)
  end

  private

  # `herald tail CHANNEL --from 0`: the first `count` lines it prints, as UTF-8 text.
  def tail_lines(channel, count, env: {})
    tail = Tail.new(channel, "--from", "0", "--dir", @dir, env: env)
    lines = Array.new(count) { tail.gets&.force_encoding(Encoding::UTF_8) }
    extra = tail.gets(timeout: 0.2)
    status, err = tail.stop
    assert_nil extra, "tail #{channel} printed more than #{count} lines"
    assert_equal 0, status&.exitstatus, "tail #{channel}: #{err}"
    assert_equal "", err, "tail #{channel} wrote to standard error"
    lines
  end
end
