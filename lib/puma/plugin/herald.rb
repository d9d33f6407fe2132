# frozen_string_literal: true

require "puma/plugin"

# `plugin :herald` in config/puma.rb: Herald's deferred workers run in every server process, started after
# the fork (each cluster worker starts its own; nothing runs in the master, so preload_app! sees no thread
# started at boot) and stopped gracefully when Puma stops that process. `rails runner` and rake never load it.
Puma::Plugin.create do
  def start(launcher)
    if launcher.options[:workers].to_i > 0 # cluster mode: each worker after its fork
      hooks = launcher.options.user_options
      (hooks[:before_worker_boot] ||= []) << proc { Herald.start_workers }
      (hooks[:before_worker_shutdown] ||= []) << proc { Herald.shutdown }
    else
      launcher.events.on_booted { Herald.start_workers }
      launcher.events.on_stopped { Herald.shutdown }
    end
  end
end
