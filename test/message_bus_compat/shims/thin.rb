# frozen_string_literal: true

# message_bus's spec_helper requires thin; only its integration specs (not run here) start a Thin server.
