# frozen_string_literal: true

# Writes the browser benchmark's backlogs into a Herald log directory, in one codec:
#   ruby bench/js_client/prepare.rb DIR json|msgpack [COUNT]
# Channels /mixed/0..4 (about 10% of messages with non-ASCII text) and /ascii/0..4 (ASCII only), COUNT
# messages each set (250,000 by default), message_bus-style payloads (ids, user, text, time).
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require "herald"

dir, codec, count = ARGV
count = Integer(count || 250_000)
abort "usage: prepare.rb DIR json|msgpack [COUNT]" unless dir && %w[json msgpack].include?(codec)

NON_ASCII = ["Grüße aus Köln, schöne Äpfel", "日本語のメッセージです", "Ça va? Très bien — merci", "🎉 shipped it 🚀 👩‍👩‍👧", "Привет, как дела?"].freeze
WORDS = %w[the deploy finished build passed review ready merge queue ticket closed opened update status green].freeze

bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: dir, max_backlog_size: count), codec: codec.to_sym)
random = Random.new(42)
%w[mixed ascii].each do |set|
  count.times do |i|
    words = Array.new(4 + random.rand(8)) { WORDS[random.rand(WORDS.size)] }.join(" ")
    text = (set == "mixed" && random.rand(10) == 0) ? "#{words} #{NON_ASCII[random.rand(NON_ASCII.size)]}" : words
    data = {"id" => i + 1, "user_id" => 1000 + random.rand(5000), "username" => "user#{random.rand(500)}",
            "text" => text, "created_at" => "2026-11-23T18:#{format("%02d", i % 60)}:00.000Z"}
    bus.publish("/#{set}/#{i % 5}", data, max_backlog_size: count)
  end
end
bus.close
puts "#{dir}: #{2 * count} messages (#{codec})"
