# frozen_string_literal: true

module Bench
  # What bin/bench and the tools in bench/tools read from wrk's printed report, in one place.
  module WrkOutput
    LATENCY_UNITS = {"us" => 0.001, "ms" => 1, "s" => 1000}.freeze

    module_function

    # The 99th percentile latency in ms (wrk run with --latency), or nil when the report has none.
    def p99_ms(out)
      value, unit = out.match(/^\s+99%\s+([\d.]+)(us|ms|s)\b/)&.captures
      value && Float(value) * LATENCY_UNITS.fetch(unit)
    end
  end
end
