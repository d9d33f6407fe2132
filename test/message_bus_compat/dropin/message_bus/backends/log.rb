# frozen_string_literal: true

# message_bus's spec_helper requires message_bus/backends/<name>, then reads MessageBus::BACKENDS (the drop-in
# defines both the map and the classes).
require "herald/message_bus"
