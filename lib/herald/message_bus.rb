# frozen_string_literal: true

require_relative "../herald"

# `require "herald/message_bus"` defines MessageBus over Herald, so an app written for the message_bus gem
# runs on Herald without changing its calls (docs/message_bus.md). Not loaded by
# `require "herald"`: an app that has the message_bus gem keeps its own MessageBus.
module MessageBus
  class Error < Herald::Error; end
  class InvalidMessage < Error; end
  class InvalidMessageTarget < InvalidMessage; end
  class BusDestroyed < Error; end
end

require_relative "message_bus/message"
require_relative "message_bus/backend"
require_relative "message_bus/implementation"
require_relative "message_bus/rack_middleware"
require_relative "message_bus/client"
require_relative "message_bus/backends"
# Rails: message_bus's Railtie wiring (lib/herald.rb has loaded Herald's own Railtie first).
require_relative "message_bus/railtie" if defined?(::Rails::Railtie)

module MessageBus
  # A bus of its own (message_bus's specs build one per test); the MessageBus module is the default one.
  class Instance
    include Implementation
  end

  extend Implementation

  initialize
end
