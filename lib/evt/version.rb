# frozen_string_literal: true

module Evt
  VERSION = "0.5.0"
end
