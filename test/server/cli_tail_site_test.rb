# frozen_string_literal: true

require "test_helper"
require_relative "../support/herald_cli"

# `herald tail --site S`: the channel of one site (message_bus's site_id), backlog and live, and nothing of
# the same channel without a site or on another site.
class CLITailSiteTest < Minitest::Test
  include Herald::HeraldCLI

  def setup
    @dir = Dir.mktmpdir("herald-tail-site")
  end

  def teardown = FileUtils.rm_rf(@dir)

  def publish(data, site_id:)
    bus = Herald::Bus.new(store: Herald::Store::Log.new(dir: @dir))
    bus.publish("/chat", data, site_id: site_id)
  ensure
    bus&.close
  end

  def test_tail_from_one_site
    publish({"text" => "no site"}, site_id: nil)
    publish({"text" => "sité 1 🎉"}, site_id: "café.example")
    publish({"text" => "other site"}, site_id: "other")
    tail = Tail.new("/chat", "--site", "café.example", "--from", "0", "--dir", @dir)
    assert_equal '{"text":"sité 1 🎉"}', tail.gets.force_encoding(Encoding::UTF_8)
    publish({"text" => "live, no site"}, site_id: nil)
    publish({"text" => "live 日本"}, site_id: "café.example")
    assert_equal '{"text":"live 日本"}', tail.gets.force_encoding(Encoding::UTF_8)
    status, err = tail.stop
    assert_equal 0, status.exitstatus, err
  end
end
