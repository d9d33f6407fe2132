# frozen_string_literal: true

module Herald
  VERSION = "0.1.0"
end
