# frozen_string_literal: true

require_relative "lib/herald/version"

Gem::Specification.new do |s|
  s.name = "herald"
  s.version = Herald::VERSION
  s.summary = "A fast, durable message bus for Ruby web apps"
  s.description = "One append-only log, many readers: browsers over HTTP (message_bus compatible), " \
    "in-process subscribers and other processes. Embedded log store by default; Redis and PostgreSQL when you outgrow one host."
  s.authors = ["Herald team"]
  s.license = "MIT"
  s.required_ruby_version = ">= 3.1"
  s.files = Dir["lib/**/*.rb", "exe/*", "README.md"] + ["lib/herald/rack/herald.js"] # herald.js: built from js/ (npm run build -w js)
  s.bindir = "exe"
  s.executables = ["herald"]
  s.add_dependency "json", ">= 2.10" # JSON::Coder, strict: what JSON cannot carry is refused, not stored as #to_s
  s.add_dependency "msgpack", "~> 1.7"
  s.add_dependency "nio4r", "~> 2.5" # epoll event loop that parks thousands of HTTP clients (see README)
  s.add_dependency "puma", ">= 6.4", "< 8" # the app server behind `herald server` (see README)
end
