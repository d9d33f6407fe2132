# frozen_string_literal: true

module Herald
  module Model
    # Random values of the kind users send: text mixing ASCII with accents, combining marks, CJK, right-to-left
    # scripts, emoji with skin tones and ZWJ sequences, U+0000 and other control or odd code points; binary
    # strings (for the MessagePack codec); and nested data built from them. Everything comes from one Random,
    # so a seed replays the same values.
    class Text
      PIECES = [
        *("a".."z"), *("A".."Z"), *("0".."9"), " ", " ", "-", "_", ".", "/", ":", ",", "|", "$", "$$", "$|", "|$",
        "\"", "'", "\\", "\n", "\t", "\r", "%", "%20", "&", "=", "?", "#", "+", "{", "}", "[", "]", "<", ">",
        "é", "è", "ñ", "ü", "Å", "ß", "ç", "œ", "e\u0301", "n\u0303", "Ω", "π", "Ж", "я",
        "日本語", "中文", "漢字", "한국어", "ひらがな", "カタカナ", "مرحبا", "שלום", "हिन्दी", "ไทย",
        "👋", "🎉", "😀", "💩", "👍🏽", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🧑‍🤝‍🧑", "❤️",
        "\u0000", "\u0001", "\u007f", "\u00a0", "\u200b", "\u200d", "\u2028", "\u2029", "\ufeff", "\ufffd",
        "\u{10ffff}", "\u{1d11e}", "\u0085"
      ].map(&:freeze).freeze

      # Pieces for a name (channel, site): short, printable or not, never the site separator "$|$" whole.
      NAME_PIECES = (PIECES - ["\n", "\r", "\t"]).freeze

      def initialize(random)
        @random = random
      end

      def int(range) = @random.rand(range)

      def chance(probability) = @random.rand < probability

      def pick(array) = array[@random.rand(array.size)]

      # Text of about `bytes` bytes (UTF-8, valid). Large ones repeat a rotation of a pool of random pieces
      # (building 1 MiB one piece at a time would cost more than the store under test).
      def text(bytes)
        out = +""
        if bytes > 4096
          @pool ||= Array.new(16_384) { pick(PIECES) }
          start = int(0...@pool.size)
          chunk = (@pool[start..] + @pool[0, start]).join
          out << chunk while out.bytesize + chunk.bytesize <= bytes
        end
        out << pick(PIECES) while out.bytesize < bytes
        out
      end

      def name(max_pieces = 6) = Array.new(int(1..max_pieces)) { pick(NAME_PIECES) }.join

      def binary(bytes) = @random.bytes(bytes).force_encoding(Encoding::BINARY)

      # A payload size: mostly small, some empty, a few up to 1 MiB.
      def size(large: true)
        roll = @random.rand
        if roll < 0.05 then 0
        elsif roll < 0.75 then int(1..40)
        elsif roll < 0.97 || !large then int(41..4096)
        else int(4097..1024 * 1024)
        end
      end

      # Data for a codec: JSON gets what JSON can carry (string keys, valid UTF-8); MessagePack also binary.
      def data(codec, depth = 0)
        case int(0..((depth > 1) ? 6 : 8))
        when 0 then nil
        when 1 then chance(0.5)
        when 2 then pick([0, -1, 1, 42, 2**31, -(2**53), 2**62, int(-1000..1000)])
        when 3 then pick([0.5, -2.25, 1.0e-7, 3.14159, 1.0e20])
        when 4, 5 then string(codec, size(large: depth.zero?))
        when 6 then (codec == :msgpack && chance(0.5)) ? binary(size(large: depth.zero?)) : string(codec, int(0..20))
        when 7 then Array.new(int(0..4)) { data(codec, depth + 1) }
        else Array.new(int(0..4)) { [key(codec), data(codec, depth + 1)] }.to_h
        end
      end

      def string(_codec, bytes) = text(bytes)

      def key(codec) = (codec == :msgpack && chance(0.1)) ? binary(int(0..8)) : text(int(0..12))
    end
  end
end
