# frozen_string_literal: true

require_relative "lib/herald/version"

Gem::Specification.new do |s|
  s.name = "herald-bus" # "herald" on RubyGems is an unrelated gem (0.3, 2011); the module stays Herald
  s.version = Herald::VERSION
  s.summary = "A fast, durable message bus for Ruby web apps"
  s.description = "One append-only log, many readers: browsers over HTTP (message_bus compatible), " \
    "in-process subscribers and other processes. Embedded log store by default; Redis and PostgreSQL when you outgrow one host."
  s.authors = ["Herald team"]
  s.license = "MIT"
  # bin/test runs the suite on Ruby 3.1 (Debian 12) and 3.3 (Debian 13, bin/ruby33).
  s.required_ruby_version = ">= 3.1"
  # No homepage or source URI yet: the repository has no public address. Add homepage, source_code_uri and
  # changelog_uri when it has one.
  s.metadata = {"rubygems_mfa_required" => "true"}
  # Every file the gem runs: the Ruby, the generator's templates, the demo page, Herald's browser client
  # (lib/herald/rack/herald.js, built from js/ by `npm run build -w js`) and message_bus's browser client from
  # the npm package (`npm ci` before `gem build`), served by `herald server`.
  s.files = Dir["lib/**/*.{rb,tt,js,css,html}", "exe/*", "README.md", "LICENSE", "CHANGELOG.md",
    "node_modules/message-bus-client/{LICENSE,assets/message-bus.js}"]
  s.bindir = "exe"
  s.executables = ["herald"]
  # The lowest of each range is what gemfiles/rack2.gemfile installs (bin/test-rack2, both Rubies).
  s.add_dependency "json", ">= 2.10", "< 4" # JSON::Coder, strict: what JSON cannot carry is refused, not stored as #to_s
  s.add_dependency "msgpack", "~> 1.7"
  # epoll event loop that parks thousands of HTTP clients (see README); 2.5.0-2.5.8 do not compile with GCC 14
  s.add_dependency "nio4r", "~> 2.5", ">= 2.5.9"
  # Optional, loaded only when used, each with a one-line message naming the gem when missing:
  # puma (`herald server`), redis-client (Store::Redis), pg (Store::Postgres).
end
