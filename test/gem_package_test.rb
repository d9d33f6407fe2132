# frozen_string_literal: true

require "test_helper"
require "open3"
require "net/http"
require "rubygems/package"

# The gem as a user gets it: `gem build` from this checkout, `gem install` into an empty GEM_HOME that holds
# only the runtime dependencies (linked from the bundle, so nothing is downloaded), then the installed
# `herald` executable and `require "herald-bus"` outside Bundler.
class GemPackageTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  BUNDLE_GEMS = Gem::Specification.map { |s| [s.name, s] }.to_h
  RUNTIME = %w[json msgpack nio4r].freeze

  def setup
    @tmp = Dir.mktmpdir("herald-gem")
  end

  def teardown
    FileUtils.rm_rf(@tmp)
  end

  def test_the_built_gem_holds_every_runtime_file
    files = Gem::Package.new(build_gem).contents
    %w[lib/herald.rb lib/herald-bus.rb exe/herald lib/herald/rack/herald.js lib/herald/server/public/index.html lib/herald/server/public/demo.js
      lib/herald/server/public/demo.css lib/herald/server/public/message-bus-ajax.js
      lib/action_cable/subscription_adapter/herald.rb lib/herald/cable/listener.rb
      node_modules/message-bus-client/assets/message-bus.js node_modules/message-bus-client/LICENSE LICENSE CHANGELOG.md].each do |f|
      assert_includes files, f
    end
    assert_equal [], files.grep(%r{\A(test|bench|vendor)/}), "no tests, benchmarks or bundled gems in the gem"
    spec = Gem::Package.new(build_gem).spec
    assert_equal "herald-bus", spec.name
    assert_equal RUNTIME.sort, spec.runtime_dependencies.map(&:name).sort, "puma, redis-client and pg are optional"
    assert_equal [["MIT"], "true"], [spec.licenses, spec.metadata["rubygems_mfa_required"]]
    assert_includes File.read(File.join(ROOT, "LICENSE")), "Copyright (c) 2026 Herald team"
    # Ready for `gem push`: no warning but the missing homepage (no public address yet, see the gemspec).
    assert_equal ["WARNING:  no homepage specified"], @build_output.lines.grep(/WARNING/).map(&:strip).grep_v(/ See https:/)
  end

  def test_installed_gem_serves_the_demo_and_names_missing_gems
    home = install_gem
    out, err, st = run_installed(home, "herald", "server", "--port", "0", "--dir", File.join(@tmp, "data"))
    assert_equal 1, st.exitstatus, out + err
    assert_equal ["herald server: herald server needs the puma gem (>= 6.4): add `gem \"puma\"` to your Gemfile (or gem install puma)"], err.lines.map(&:chomp)

    script = 'require "herald-bus"; Herald::Store::Redis'
    _, err, st = run_installed(home, "ruby", "-e", "begin; #{script}; rescue LoadError => e; puts e.message; exit 3; end")
    assert_equal 3, st.exitstatus, err
    _, err, st = run_installed(home, "ruby", "-e", 'require "herald-bus"; Herald::Store::Postgres')
    assert_match(/needs the pg gem: add `gem "pg"` to your Gemfile/, err)
    refute st.success?

    link_gem(home, "puma")
    assert_demo_served(home)
  end

  # The README's first Rails step as a newcomer runs it: this repository cloned beside the app, the README's
  # Gemfile lines in the app's Gemfile, then its `bundle install` as written, in an empty GEM_HOME holding only
  # the runtime dependencies (the remote index is still read). The generator, the step's last line, needs Rails:
  # test/rails/rails_app_test.rb runs it.
  def test_the_readme_rails_install_lines_work_from_a_clone
    section = File.read(File.join(ROOT, "README.md"))[/^## Installing in Rails\n.*?(?=^## )/m]
    gemfile_lines = section[/```ruby\n# Gemfile\n(.*?)```/m, 1] or flunk "no Gemfile block in the README's Rails section"
    commands = section[/```sh\n(bundle install\n.*?)```/m, 1].to_s.lines.map(&:strip)
    assert_equal ["bundle install", "bin/rails generate herald:install"], commands
    if (path = gemfile_lines[/^gem "herald-bus", path: "([^"]+)"/, 1])
      out, st = Open3.capture2e(clean_env, "git", "clone", "--quiet", ROOT, File.expand_path(path, File.join(@tmp, "app")))
      assert st.success?, out
    end
    FileUtils.mkdir_p(File.join(@tmp, "app"))
    File.write(File.join(@tmp, "app", "Gemfile"), %(source "https://rubygems.org"\n) + gemfile_lines)
    home = File.join(@tmp, "home")
    RUNTIME.each { |name| link_gem(home, name) }
    env = clean_env.merge("GEM_HOME" => home, "GEM_PATH" => home)
    out, st = Open3.capture2e(env, *commands.first.split, chdir: File.join(@tmp, "app"))
    assert st.success?, out
    assert_includes File.read(File.join(@tmp, "app", "Gemfile.lock")).lines, "    herald-bus (#{Herald::VERSION})\n"
    script = 'require "herald-bus"; bus = Herald::Bus.new(store: Herald::Store::Memory.new); bus.publish("/c", {"t" => "é"}); puts bus.backlog("/c").first.data["t"]'
    out, st = Open3.capture2e(env, "bundle", "exec", "ruby", "-e", script, chdir: File.join(@tmp, "app"))
    assert_equal ["é\n", true], [out, st.success?]
  end

  private

  def build_gem
    @gem ||= File.join(@tmp, "herald-bus.gem").tap do |path|
      @build_output, st = Open3.capture2e(clean_env, "gem", "build", "herald-bus.gemspec", "--output", path, chdir: ROOT)
      assert st.success?, @build_output
    end
  end

  # An empty GEM_HOME with the runtime dependencies linked in, then `gem install --local` of the built gem.
  def install_gem
    home = File.join(@tmp, "home")
    RUNTIME.each { |name| link_gem(home, name) }
    out, st = Open3.capture2e(clean_env.merge("GEM_HOME" => home, "GEM_PATH" => home),
      "gem", "install", "--local", "--no-document", build_gem, chdir: @tmp)
    assert st.success?, out
    home
  end

  def link_gem(home, name)
    spec = BUNDLE_GEMS.fetch(name)
    spec.runtime_dependencies.each { |d| link_gem(home, d.name) unless File.exist?(File.join(home, "gems", "#{d.name}-#{BUNDLE_GEMS.fetch(d.name).version}")) }
    {"specifications/#{spec.full_name}.gemspec" => spec.loaded_from, "gems/#{spec.full_name}" => spec.full_gem_path,
     "extensions/#{Gem::Platform.local}/#{Gem.extension_api_version}/#{spec.full_name}" => spec.extension_dir}.each do |to, from|
      next unless File.exist?(from)
      FileUtils.mkdir_p(File.dirname(File.join(home, to)))
      FileUtils.ln_sf(from, File.join(home, to))
    end
  end

  def run_installed(home, *cmd)
    cmd[0] = File.join(home, "bin", "herald") if cmd[0] == "herald"
    Open3.capture3(clean_env.merge("GEM_HOME" => home, "GEM_PATH" => home), *cmd, chdir: @tmp)
  end

  # No Bundler: the installed gem and what its GEM_HOME holds, nothing from this checkout's bundle.
  def clean_env
    ENV.to_h.select { |k, _| k.start_with?("BUNDLE_", "BUNDLER_", "GEM_") || k == "RUBYOPT" || k == "RUBYLIB" }.transform_values { nil }
  end

  def assert_demo_served(home)
    env = clean_env.merge("GEM_HOME" => home, "GEM_PATH" => home)
    Open3.popen2e(env, File.join(home, "bin", "herald"), "server", "--port", "0", "--dir", File.join(@tmp, "data"), chdir: @tmp) do |_in, out, wait|
      line = Timeout.timeout(30) { out.gets }.to_s
      url = line[%r{http://\S+}] or flunk "no URL in #{line.inspect}"
      {"/" => "<html", "/message-bus/herald.js" => "MessageBus", "/assets/message-bus.js" => "MessageBus", "/assets/message-bus-ajax.js" => "MessageBus.ajax",
       "/assets/demo.js" => "", "/assets/demo.css" => ""}.each do |path, text|
        res = Net::HTTP.get_response(URI(url + path))
        assert_equal "200", res.code, "#{path}: #{res.body}"
        assert_includes res.body, text, path
      end
    ensure
      Process.kill(:TERM, wait.pid)
      wait.value
    end
  end
end
