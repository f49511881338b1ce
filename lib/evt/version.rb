# frozen_string_literal: true

module Evt
  # evt's version (the gem's).
  VERSION = "0.5.0"
end
