# frozen_string_literal: true

# fake_async_middleware (used by the middleware specs, not run here yet) requires the http_parser.rb gem.
