# frozen_string_literal: true

require "rails/generators/base"
require_relative "cable_config"

module Herald
  module Rails
    # `bin/rails g herald:install`: config/initializers/herald.rb (lookups, store), Herald's browser client
    # in the application layout, `plugin :herald` in config/puma.rb (deferred workers in every server
    # process), and `adapter: herald` in config/cable.yml (ActionCable and Turbo Streams through Herald's
    # store; --skip-cable leaves cable.yml alone).
    class InstallGenerator < ::Rails::Generators::Base
      namespace "herald:install"
      source_root File.expand_path("templates", __dir__)
      desc "Configures Herald: an initializer, the browser client in the layout, the Puma plugin, adapter: herald in config/cable.yml."

      class_option :skip_cable, type: :boolean, default: false,
        desc: "Leave config/cable.yml alone (default: adapter: herald in development and production)"

      LAYOUT = "app/views/layouts/application.html.erb"
      CABLE = "config/cable.yml"
      SCRIPT = %(    <script src="/message-bus/herald.js"></script>\n)

      def initializer
        template "initializer.rb.tt", "config/initializers/herald.rb"
      end

      def client_script
        layout = File.join(destination_root, LAYOUT)
        return say_status(:skip, "#{LAYOUT} not found: add #{SCRIPT.strip} to your layout", :yellow) unless File.exist?(layout)
        return if File.read(layout).include?("/message-bus/herald.js")
        inject_into_file LAYOUT, SCRIPT, before: %r{^\s*</head>}
      end

      def puma_plugin
        puma = File.join(destination_root, "config/puma.rb")
        return unless File.exist?(puma) && !File.read(puma).match?(/^\s*plugin :herald/)
        append_to_file "config/puma.rb", "\n# Herald's deferred subscribers: workers in every server process, started after fork.\nplugin :herald\n"
      end

      # ActionCable's broadcasts (Turbo Streams' broadcast_*_to) through Herald's store: every process of
      # the app (Puma workers, `bin/rails runner`, jobs) reaches every browser, with no Redis.
      def cable_adapter
        return if options[:skip_cable]
        path = File.join(destination_root, CABLE)
        return say_status(:skip, "#{CABLE} not found (no ActionCable)", :yellow) unless File.exist?(path)
        updated = CableConfig.use_herald(File.read(path))
        return say_status(:identical, "#{CABLE} (adapter: herald)", :blue) unless updated
        create_file CABLE, updated, force: true
      end
    end
  end
end
