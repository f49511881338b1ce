# frozen_string_literal: true

module Bench
  # The falcon scenario's Rack apps, the same for every server (Falcon, Itsi):
  #
  #   hello   answers "hello" at once
  #   sleep   sleeps 1 ms first (sleep 0.001: under a fiber scheduler, the scheduler's kernel_sleep)
  module RackApps
    APPS = {
      "hello" => ->(_env) { [200, {"content-type" => "text/plain"}, ["hello"]] },
      "sleep" => lambda do |_env|
        sleep 0.001
        [200, {"content-type" => "text/plain"}, ["hello"]]
      end,
    }.freeze

    def self.fetch(name)
      APPS.fetch(name) { raise ArgumentError, "unknown app #{name.inspect} (#{APPS.keys.join(", ")})" }
    end
  end
end
