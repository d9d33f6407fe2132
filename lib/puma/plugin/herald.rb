# frozen_string_literal: true

require "puma/plugin"

# `plugin :herald` in config/puma.rb: Herald's deferred workers run in every server process, started after
# the fork (each cluster worker starts its own; nothing runs in the master, so preload_app! sees no thread
# started at boot) and stopped gracefully when Puma stops that process. `rails runner` and rake never load it.
#
# Only Puma's public hook API is used, so Puma 6, 7 and 8 store the hooks in their own format (Puma 7 keeps
# `{block:, id:}` Hashes where Puma 6 kept procs). The hooks are added once the mode is known (in `start`,
# after Puma read its configuration): a worker hook in single mode would make Puma 7+ warn at every boot.
Puma::Plugin.create do
  def start(launcher)
    if launcher.options[:workers].to_i > 0
      launcher.config.configure do |_user, file, _default|
        hook(file, :before_worker_boot, :on_worker_boot) { |index| start_herald("worker #{index}") }
        hook(file, :before_worker_shutdown, :on_worker_shutdown) { Herald.shutdown }
      end
    else
      events = launcher.events
      hook(events, :after_booted, :on_booted) { start_herald("single mode") }
      hook(events, :after_stopped, :on_stopped) { Herald.shutdown } # inside Puma's SIGTERM trap
    end
  end

  private

  # Puma 7 renamed the hooks (before_worker_boot, after_booted, ...); the old names warn there, and Puma 6
  # has only those.
  def hook(target, name, old_name, &block)
    target.public_send(target.respond_to?(name) ? name : old_name, &block)
  end

  def start_herald(where)
    Herald.start_workers
    names = Herald::Events.runtime.workers.map(&:name)
    Herald.logger.info("Puma #{where} (pid #{Process.pid}): " +
      (names.empty? ? "no deferred subscribers" : "deferred subscribers running: #{names.join(", ")}"))
  end
end
