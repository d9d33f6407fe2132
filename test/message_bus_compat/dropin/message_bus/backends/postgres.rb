# frozen_string_literal: true

# message_bus's spec_helper loads message_bus/backends/<name> and reads MessageBus::BACKENDS.
MessageBus::BACKENDS = {memory: :memory, redis: :redis, postgres: :postgres, log: :log}.freeze unless defined?(MessageBus::BACKENDS)
