# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/servers"

# One environment variable switches stores: Herald.configure { |c| c.store = ENV["HERALD_STORE"] }.
class StoreFromUrlTest < Minitest::Test
  def teardown
    Herald.reset!
    super
  end

  def configured_store(url)
    Herald.configure { |c| c.store = url }
    Herald.bus.store
  end

  def test_a_directory_is_the_embedded_log
    Dir.mktmpdir do |dir|
      assert_instance_of Herald::Store::Log, configured_store(dir)
      Herald.publish("/a", 1)
      assert_equal [1], Herald.backlog("/a").map(&:data)
    end
  end

  def test_redis_and_rediss_urls
    Herald::TestServers.require!(self, :redis)
    assert_instance_of Herald::Store::Redis, configured_store(Herald::TestServers.redis_url)
    Herald.publish("/from-url", "r")
    assert_operator Herald.last_id("/from-url"), :>=, 1
  end

  def test_postgres_urls
    Herald::TestServers.require!(self, :postgres)
    store = configured_store(Herald::TestServers.postgres_url.sub("postgres://", "postgresql://"))
    assert_instance_of Herald::Store::Postgres, store
    assert_operator Herald.publish("/from-url", "p"), :>=, 1
  end

  def test_memory_url
    assert_instance_of Herald::Store::Memory, Herald::Store.from_url("memory:")
  end

  def test_unknown_scheme_is_an_argument_error_naming_the_choices
    error = assert_raises(Herald::InvalidArgumentError) { Herald::Store.from_url("mysql://x/y") }
    assert_match(/redis:\/\/.*postgres:\/\//, error.message)
    assert_raises(Herald::InvalidArgumentError) { Herald::Store.from_url("") }
  end

  def test_cli_publish_follows_herald_store
    url = Herald::TestServers.require!(self, :redis)
    require "herald/cli"
    out = StringIO.new
    with_env("HERALD_STORE" => url) { assert_equal 0, Herald::CLI.run(["publish", "/cli-url", '{"a":1}'], out: out, err: out) }
    store = Herald::Store::Redis.new(url: url)
    assert_equal [{"a" => 1}], store.backlog("/cli-url", out.string.to_i - 1).map(&:data)
  ensure
    store&.close
  end

  def with_env(vars)
    old = vars.to_h { |k, _| [k, ENV[k]] }
    vars.each { |k, v| ENV[k] = v }
    yield
  ensure
    old.each { |k, v| ENV[k] = v }
  end
end
