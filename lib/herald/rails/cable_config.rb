# frozen_string_literal: true

module Herald
  module Rails
    # The generator's change to config/cable.yml: `adapter: herald` in development and production (the test
    # environment keeps ActionCable's test adapter). A section's `channel_prefix:` is kept; its other lines
    # stay as comments under the new adapter, their ERB escaped (cable.yml goes through ERB, comments too).
    # Plain text in, text out (no YAML round trip: comments, ERB and order survive).
    module CableConfig
      ENVIRONMENTS = %w[development production].freeze
      SECTION = /\A([A-Za-z_][\w-]*):\s*(#.*)?\z/
      ADAPTER = "  adapter: herald\n"

      # => the new text, or nil when every environment already uses Herald.
      def self.use_herald(text)
        sections = split(text)
        changed = false
        ENVIRONMENTS.each do |env|
          body = sections[env]
          next if body&.any? { |l| l.match?(/\A\s+adapter:\s*["']?herald["']?\s*(#.*)?\z/) }
          sections[env] = body ? rewrite(body) : [ADAPTER]
          changed = true
        end
        changed ? join(sections) : nil
      end

      # {"header" => lines before the first section, env => its lines (without the "env:" line)}, in order.
      def self.split(text)
        sections = {nil => []}
        current = nil
        text.each_line do |line|
          line += "\n" unless line.end_with?("\n")
          if (name = line.chomp[SECTION, 1])
            sections[current = name] = []
          else
            sections[current] << line
          end
        end
        sections
      end

      def self.rewrite(body)
        blank = body.reverse.take_while { |l| l.strip.empty? }
        lines = body[0, body.size - blank.size]
        kept, old = lines.partition { |l| l.match?(/\A\s+channel_prefix:/) }
        old = old.reject { |l| l.strip.empty? }
        previous = old.empty? ? [] : ["  # Before `rails g herald:install`:\n", *old.map { |l| "  # #{l.strip.gsub("<%", "<%%")}\n" }]
        [ADAPTER, *kept, *previous, *blank]
      end

      def self.join(sections)
        sections.map { |name, lines| name ? ["#{name}:\n", *lines] : lines }.join
      end

      private_class_method :split, :rewrite, :join
    end
  end
end
