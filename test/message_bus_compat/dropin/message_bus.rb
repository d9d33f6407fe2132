# frozen_string_literal: true

# In the harness, `require "message_bus"` loads Herald's drop-in instead of the gem.
require "herald/message_bus"
