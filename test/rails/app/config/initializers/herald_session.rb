# frozen_string_literal: true

# The session-based lookup of the generator's initializer (config/initializers/herald.rb), switched on.
Rails.application.config.herald.user_id_lookup = ->(env) { env["rack.session"]&.[]("user_id") }
