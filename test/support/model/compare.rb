# frozen_string_literal: true

require "set"

module Herald
  module Model
    # A difference between the oracle and the subject: a defect, unless the model is wrong.
    class Mismatch < StandardError; end

    # How the Runner compares answers. Strings are the same only with the same bytes AND the same encoding
    # (String#== ignores the encoding of ASCII-only strings: "a".b == "a").
    module Compare
      FIELDS = %i[global_id message_id channel site_id].freeze
      TARGETS = %i[user_ids group_ids client_ids].freeze

      private

      def same?(a, b)
        case a
        when String then b.is_a?(String) && a.encoding == b.encoding && a.bytesize == b.bytesize && a == b
        when Array then b.is_a?(Array) && a.size == b.size && a.each_index.all? { |i| same?(a[i], b[i]) }
        when Hash then b.is_a?(Hash) && same?(a.keys, b.keys) && same?(a.values, b.values)
        else a.instance_of?(b.class) && a.eql?(b)
        end
      end

      # Everything a reader can see of one message, except created_at (each store's own clock).
      def compare_message(what, expected, actual)
        diffs = FIELDS.reject { |f| same?(expected.public_send(f), actual.public_send(f)) }
        diffs.concat(TARGETS.reject { |f| same?(as_stored(expected.public_send(f)), as_stored(actual.public_send(f))) })
        diffs << :codec unless expected.codec == actual.codec
        diffs << :payload unless same?(expected.payload, actual.payload)
        diffs << :created_at unless actual.created_at.is_a?(Float)
        if diffs.empty? && !@data_checked.include?(actual.global_id)
          diffs << :data unless same?(expected.data, actual.data)
          @data_checked << actual.global_id
        end
        return if diffs.empty?
        fail!("#{what}: message #{expected.global_id} differs in #{diffs.join(", ")}\n" +
          diffs.map { |f| "    #{f}: expected #{show(value(expected, f))}, got #{show(value(actual, f))}" }.join("\n"))
      end

      # Target ids go through MessagePack in every store but Memory: a US-ASCII String (what Integer#to_s
      # returns) comes back as UTF-8, with the same bytes. Targets are matched with ==, which agrees.
      def as_stored(targets)
        return targets unless targets.is_a?(Array)
        targets.map { |t| (t.is_a?(String) && t.encoding == Encoding::US_ASCII) ? t.dup.force_encoding(Encoding::UTF_8) : t }
      end

      def value(msg, field) = (field == :codec) ? msg.codec&.name : msg.public_send(field)

      # A list of messages, oldest first, against the oracle's. `optional` global ids may be present or not
      # (see Runner: expiry at the edge of the read, Redis's batched trim); everything else must match
      # exactly. With a limit, only what precedes the last message returned is required.
      def compare_list(what, expected, actual, optional: Set.new, limit: nil)
        fail!("#{what}: #{actual.class} instead of an Array") unless actual.is_a?(Array)
        by_id = expected.to_h { |m| [m.global_id, m] }
        previous = 0
        actual.each do |m|
          fail!("#{what}: global ids out of order: #{m.global_id} after #{previous}\n#{list(what, expected, actual)}") unless m.global_id > previous
          previous = m.global_id
          ref = by_id[m.global_id] || (optional.include?(m.global_id) && @published[m.global_id]&.message)
          fail!("#{what}: unexpected message #{describe(m)}\n#{list(what, expected, actual)}") unless ref
          compare_message(what, ref, m)
        end
        fail!("#{what}: #{actual.size} messages, more than the limit #{limit}") if limit && actual.size > limit
        horizon = (limit && actual.size == limit) ? previous : Float::INFINITY
        got = actual.to_set(&:global_id)
        missing = expected.find { |m| m.global_id <= horizon && !optional.include?(m.global_id) && !got.include?(m.global_id) }
        fail!("#{what}: missing #{describe(missing)}\n#{list(what, expected, actual)}") if missing
      end

      def list(what, expected, actual)
        "    oracle:  #{ids(expected)}\n    subject: #{ids(actual)}"
      end

      def ids(messages)
        shown = messages.last(40).map { |m| "#{m.global_id}:#{m.message_id}" }.join(" ")
        (messages.size > 40) ? "(#{messages.size}) ... #{shown}" : "(#{messages.size}) #{shown}"
      end

      def describe(msg)
        "#{msg.global_id} (#{show(msg.channel)} site #{show(msg.site_id)} message_id #{msg.message_id}#{timing(msg)})"
      end

      # For messages that can expire: how long ago they were published, and their age limit.
      def timing(msg)
        r = @published[msg.global_id]
        return "" unless r && r.age < Runner::SHORT_AGE
        t = Process.clock_gettime(Process::CLOCK_REALTIME)
        ", max_backlog_age #{r.age}, published #{(t - r.p1).round(3)}..#{(t - r.p0).round(3)}s ago"
      end

      def show(value, max = 120)
        text = value.inspect
        text = "#{text[0, max]}...(#{text.size} chars)" if text.size > max
        value.is_a?(String) ? "#{text} [#{value.encoding}, #{value.bytesize} B]" : text
      end

      # Both raised the same error class, or neither raised: true when both returned. Whatever the public API
      # raises must be a Herald::Error (issue 23: RangeError, ArgumentError and comparison errors got out).
      def same_outcome?(what, expected, actual)
        [expected, actual].each do |result|
          next unless result[0] == :error && !result[1].is_a?(Herald::Error)
          fail!("#{what}: #{result.equal?(expected) ? "oracle" : "subject"} raised outside Herald::Error: #{outcome(result)}")
        end
        if expected[0] == :error || actual[0] == :error
          return false if expected[0] == actual[0] && expected[1].instance_of?(actual[1].class)
          fail!("#{what}: oracle #{outcome(expected)}, subject #{outcome(actual)}")
        end
        true
      end

      def outcome(result)
        return "returned #{show(result[1])}" if result[0] == :ok
        error = result[1]
        "raised #{error.class}: #{error.message[0, 300]}\n      #{error.backtrace&.first(6)&.join("\n      ")}"
      end

      def attempt
        [:ok, yield]
      rescue => e
        [:error, e]
      end
    end
  end
end
