# frozen_string_literal: true

# message_bus's wait_for prints the block's source when it times out (method_source gem); the location will do.
class Proc
  def source = "(block at #{source_location&.join(":")})" unless method_defined?(:source)
end
