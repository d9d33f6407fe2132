# frozen_string_literal: true

# message_bus's spec_helper requires thin; only its integration specs (not run here) start a Thin server.
# Thin loads Rack, which the middleware spec relies on (Rack::Builder).
require "rack"

# client_spec uses SecureRandom without requiring it: message_bus's rake task runs every spec file in one
# process, where another file has loaded it (alone, on memory, it is a NameError). spec_helper requires thin
# first thing, so it is loaded here.
require "securerandom"
