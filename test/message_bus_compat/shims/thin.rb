# frozen_string_literal: true

# message_bus's spec_helper requires thin; only its integration specs (not run here) start a Thin server.
# Thin loads Rack, which the middleware spec relies on (Rack::Builder).
require "rack"
