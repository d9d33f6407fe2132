# frozen_string_literal: true

# The data users send, for the round-trip tests of every store and wire: accents, CJK, emoji and ZWJ
# sequences, NUL, separators, empty and 1 MiB values; odd channel names and site ids; binary.
module RealData
  TEXTS = [
    "héllo 👋", "漢字かな交じり文", "👩‍👩‍👧‍👦 family", "🏳️‍🌈", "e\u0301 combining", "עברית RTL",
    "\u0000", "a\u0000b\u0000", "", "\u2028\u2029 separators", "\"quotes\" \\ </script> \n\t\r",
    "\u{10FFFF}\u{FFFD}\u{FEFF}", "é" * (512 * 1024) # 1 MiB of two-byte characters
  ].freeze
  CHANNELS = ["/chat", "/chat/héllo", "/日本語", "/👩‍👩‍👧‍👦", "/a\u0000b", "/x|y", "/$$", "/#{"é" * 100}"].freeze
  SITES = [nil, "", "sité", "日本", "\u0000", "👋"].freeze
  BINARY = [(0..255).to_a.pack("C*"), "".b, "\xFF\xFE\x00".b, Random.new(1).bytes(1024 * 1024)].freeze
end
