# frozen_string_literal: true

module Herald
  module Rack
    # The Rack env keys Herald's own layers pass to each other (the middleware, its Responder, herald server's
    # front end). Declared here so that who sets a key and who reads it is written down once.
    module EnvKeys
      # Set by the Responder (and Middleware#cached) on an immediate reply that depends only on the request and
      # the store's contents, not on who asked (no extra_response_headers_lookup: the headers are the same too);
      # read by herald server's front end (Server::Front#inline), which keeps the whole HTTP reply in its
      # ReplyCache until the store changes. Its value: the number of messages the reply carries (counted as
      # delivered, Herald::Metrics, each time the kept reply is given again).
      SHARED_REPLY = "herald.shared_reply"
      # Set by herald server's front end when an app takes the socket (Server::Front#hijack, from rack.hijack);
      # read by the same front end's loop and thread pool, which then write nothing and forget the connection.
      HIJACKED = "herald.hijacked"
    end
  end
end
