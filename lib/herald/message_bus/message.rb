# frozen_string_literal: true

module MessageBus
  # A message as message_bus hands it out: a Struct with the targets and site as accessors, and
  # message_bus's "global_id|message_id|channel|data" encoding (a | in a channel written $$123$$).
  class Message < Struct.new(:global_id, :message_id, :channel, :data)
    attr_accessor :site_id, :user_ids, :group_ids, :client_ids

    PIPE = "$$123$$"

    def self.decode(encoded)
      s1 = encoded.index("|")
      s2 = encoded.index("|", s1 + 1)
      s3 = encoded.index("|", s2 + 1)
      channel = encoded[(s2 + 1)...s3].gsub(PIPE, "|")
      new(encoded[0...s1].to_i, encoded[(s1 + 1)...s2].to_i, channel, encoded[(s3 + 1)..])
    end

    # From a Herald::Message: its data decoded once, its targets and site copied.
    def self.from_herald(msg)
      new(msg.global_id, msg.message_id, msg.channel, msg.data).tap do |m|
        m.site_id = msg.site_id
        m.user_ids = msg.user_ids
        m.group_ids = msg.group_ids
        m.client_ids = msg.client_ids
      end
    end

    def encode = "#{global_id}|#{message_id}|#{channel.gsub("|", PIPE)}|#{data}"

    def encode_without_ids = "#{channel.gsub("|", PIPE)}|#{data}"
  end
end
