# frozen_string_literal: true

module Herald
  module Store
    # What an operator sets for a durable reader, kept in the store so every process obeys it (the
    # dashboard pauses a subscriber whose workers run elsewhere). Built on the cursor contract
    # (load_cursor / save_cursor under reserved names), so every store carries it the same way and a
    # store that keeps cursors needs nothing more. Included by Memory, Log, Redis and Postgres.
    #
    #   pause(name) / resume(name)     the deferred subscriber `name` stops reading (its worker saves its
    #                                  cursor and lets go of its lease) until resumed
    #   paused?(name)                  => true while paused
    #   reset_mark(name) / mark_reset(name, dead_letter_id)
    #                                  the last dead-letter id when an operator moved the cursor: older
    #                                  dead letters no longer push a resuming worker past them
    #   mark_retrying(name, global_id, attempt) / clear_retrying(name)
    #   retrying(name)                 => [global id, attempt] while `name`'s worker retries an event, else nil
    module Controls
      PAUSED = "herald.paused:"
      RESET = "herald.reset:"
      RETRYING = "herald.retrying:"
      ATTEMPT = "herald.attempt:"
      REQUESTS = "herald.retry-requests:" # the last dead-letter retry request a worker served

      def pause(name) = save_cursor(PAUSED + name.to_s, 1)

      def resume(name) = save_cursor(PAUSED + name.to_s, 0)

      def paused?(name) = load_cursor(PAUSED + name.to_s, default: 0) == 1

      def reset_mark(name) = load_cursor(RESET + name.to_s, default: 0)

      def mark_reset(name, dead_letter_id) = save_cursor(RESET + name.to_s, dead_letter_id)

      def mark_retrying(name, global_id, attempt)
        save_cursor(ATTEMPT + name.to_s, attempt)
        save_cursor(RETRYING + name.to_s, global_id)
      end

      def clear_retrying(name) = save_cursor(RETRYING + name.to_s, 0)

      def retrying(name)
        global_id = load_cursor(RETRYING + name.to_s, default: 0)
        [global_id, load_cursor(ATTEMPT + name.to_s, default: 0)] unless global_id.zero?
      end
    end
  end
end
