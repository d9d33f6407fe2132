# frozen_string_literal: true

require "json"

module MessageBus
  # message_bus's Client (4.5.1): one poller's subscriptions, what it may see (#allowed?), its backlog with the
  # `/__status` message, and the HTTP bytes of a reply or a stream written to a hijacked socket. Herald's
  # middleware does not use it (Herald::Rack::Client and the event loop serve polls); apps and tests that build
  # one get message_bus's behaviour over the drop-in's bus. Ported from message_bus (MIT, Sam Saffron).
  class Client
    attr_accessor :client_id, :user_id, :group_ids, :connect_time, :site_id, :cleanup_timer, :async_response,
      :io, :headers, :seq, :use_chunked
    attr_reader :subscriptions

    NEWLINE = "\r\n"
    SEPARATOR = "\r\n|\r\n"

    def initialize(opts)
      @client_id = opts[:client_id]
      @user_id = opts[:user_id]
      @group_ids = opts[:group_ids] || []
      @site_id = opts[:site_id]
      @seq = opts[:seq].to_i
      @headers = opts[:headers] || {}
      @connect_time = Time.now
      @lock = Mutex.new
      @bus = opts[:message_bus] || MessageBus
      @subscriptions = {}
      @chunks_sent = 0
      @async_response = nil
      @io = nil
      @wrote_headers = false
    end

    def synchronize(&) = @lock.synchronize(&)

    def close
      if cleanup_timer
        cleanup_timer.cancel
        self.cleanup_timer = nil
      end
      ensure_closed!
    end

    def deliver_backlog(backlog)
      return if backlog.empty?
      use_chunked ? write_chunk(to_json(backlog)) : write_and_close(to_json(backlog))
    end

    def ensure_first_chunk_sent
      write_chunk("[]") if use_chunked && @chunks_sent == 0
    end

    def closed? = !@async_response && !@io

    # nil or "": from the channel's last id now.
    def subscribe(channel, last_seen_id)
      last_seen_id = nil if last_seen_id == ""
      last_seen_id ||= @bus.last_id(channel)
      @subscriptions[channel] = last_seen_id.to_i
    end

    def <<(msg)
      use_chunked ? write_chunk(to_json([msg])) : write_and_close(to_json([msg]))
    end

    # client_ids AND (user_ids OR group_ids; empty lists target nobody in particular), then the bus's client
    # message filters whose prefix matches, last registered first.
    def allowed?(msg)
      return false unless listed?(msg.client_ids, [client_id])
      users = msg.user_ids
      groups = msg.group_ids
      targeted = !users.to_a.empty? || !groups.to_a.empty?
      return false if targeted && !(users.to_a.include?(user_id) || groups.to_a.intersect?(group_ids || []))
      filters_allow?(msg)
    end

    # message_bus's five cases per channel (-1, lookbehind, up to date, ahead, behind), then one `/__status`
    # message for the channels subscribed from now or with messages this client may not see.
    def backlog
      out = []
      hidden = {}
      last_ids = @bus.last_ids(*@subscriptions.keys, site_id: site_id)
      @subscriptions.each do |channel, seen|
        from = start_after(channel, seen.to_i, last_ids[channel]) or next
        @bus.backlog(channel, from, site_id).each do |msg|
          allowed?(msg) ? out << msg : hidden[channel] = msg.message_id
        end
      end
      status = status_for(last_ids, hidden)
      out << Message.new(-1, -1, "/__status", status) if status
      out
    end

    private

    def listed?(ids, mine) = ids.nil? || ids.empty? || ids.intersect?(mine)

    def filters_allow?(msg)
      @bus.client_message_filters.reverse_each do |prefix, filter|
        next unless msg.channel.start_with?(prefix)
        return false unless filter.call(msg)
      end
      true
    end

    def start_after(channel, seen, last)
      return [last + seen + 1, 0].max if seen < -1 # lookbehind: -2 is the last message
      return nil if seen == -1 || seen == last
      return (@subscriptions[channel] = -1) && nil if seen > last # ahead of the bus (reset): a status instead
      seen
    end

    def status_for(last_ids, hidden)
      status = nil
      @subscriptions.each do |channel, seen|
        next unless seen.to_i == -1 || hidden.key?(channel)
        status ||= {}
        @subscriptions[channel] = status[channel] = last_ids[channel]
      end
      status
    end

    def to_json(msgs) = MessageBus::Rack::Middleware.backlog_to_json(msgs)

    def write_headers(type)
      head = +"HTTP/1.1 200 OK\r\n"
      @headers.each { |name, value| head << "#{name}: #{value}\r\n" unless name.casecmp?("content-type") }
      head << "Connection: close\r\nContent-Type: #{type}\r\n"
    end

    def write_chunk(data)
      data = data.gsub(SEPARATOR, "\r\n||\r\n")
      chunk = "#{(data.bytesize + SEPARATOR.bytesize).to_s(16)}\r\n#{data}#{SEPARATOR}\r\n"
      @chunks_sent += 1
      if @async_response
        @async_response << chunk
      elsif @io
        unless @wrote_headers
          # nosniff: without it Chrome delays onprogress calls.
          chunk.prepend(write_headers("text/plain; charset=utf-8"), "Transfer-Encoding: chunked\r\nX-Content-Type-Options: nosniff\r\n\r\n")
          @wrote_headers = true
        end
        @io.write(chunk)
      end
    end

    def write_and_close(data)
      if @io
        @io.write(write_headers("application/json; charset=utf-8") + "Content-Length: #{data.bytesize}\r\n\r\n" + data)
        @io.close
        @io = nil
      elsif @async_response
        @async_response << data
        @async_response.done
        @async_response = nil
      end
    end

    def ensure_closed!
      return if closed?
      return write_and_close("[]") unless use_chunked
      write_chunk("[]")
      if @io
        @io.write("0\r\n\r\n")
        @io.close
        @io = nil
      end
      if @async_response
        @async_response << "0\r\n\r\n"
        @async_response.done
        @async_response = nil
      end
    rescue IOError, SystemCallError
      # a dead socket: nothing more to say to it
      @io = nil
      @async_response = nil
    end
  end
end
