# frozen_string_literal: true

module Evt
  VERSION = "0.1.0"
end
