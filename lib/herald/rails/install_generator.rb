# frozen_string_literal: true

require "rails/generators/base"

module Herald
  module Rails
    # `bin/rails g herald:install`: config/initializers/herald.rb (lookups, store), Herald's browser client
    # in the application layout, and `plugin :herald` in config/puma.rb (deferred workers in every server
    # process).
    class InstallGenerator < ::Rails::Generators::Base
      namespace "herald:install"
      source_root File.expand_path("templates", __dir__)
      desc "Configures Herald: an initializer, the browser client in the layout, the Puma plugin."

      LAYOUT = "app/views/layouts/application.html.erb"
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
    end
  end
end
