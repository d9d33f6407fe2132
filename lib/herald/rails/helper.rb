# frozen_string_literal: true

module Herald
  module Rails
    # View helper, included in every view by the Railtie:
    #
    #   <%= herald_subscribe "/chat" %>                      # <herald-subscription channel="/chat">
    #   <%= herald_subscribe "/rooms/1", turbo_stream: true %> # applies the Turbo Stream HTML it receives
    #
    # The element (defined by /message-bus/herald.js) subscribes while it is in the page and unsubscribes when
    # Turbo Drive or a Turbo Frame removes it, so visits never stack subscriptions; each message is a bubbling
    # `herald:message` DOM event (detail: channel, data, globalId, messageId).
    module Helper
      def herald_subscribe(channel, turbo_stream: false, last_id: nil, **attributes)
        attributes = attributes.merge(channel: channel)
        attributes[:"turbo-stream"] = "" if turbo_stream
        attributes[:"last-id"] = Integer(last_id) unless last_id.nil?
        content_tag("herald-subscription", nil, attributes)
      end
    end
  end
end
