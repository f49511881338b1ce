# frozen_string_literal: true

require "fileutils"

module Bench
  # A wrk script that starts a load's requests on a fixed schedule (bin/bench --soak-rate, and
  # bench/tools/soak_memory.rb). wrk asks `delay` before each request of any of the thread's
  # connections; each call takes the schedule's next start, so the load's rate is the schedule's
  # whatever the responses take (while they take less than its connections can cover). Behind by a
  # hiccup of wrk's own, it catches up on at most a second of starts. The clock is LuaJIT's FFI to
  # clock_gettime: wrk's Lua has no clock finer than a second.
  module WrkSchedule
    module_function

    # {connections => script path} for each of `loads` ([connections, ...]), written under `prefix`
    # (prefix-CONNECTIONS.lua): `rate` requests a second in all, each load its share by connections.
    def scripts(prefix, loads, rate)
      total = loads.sum(&:first)
      loads.to_h { |connections, *| [connections, write("#{prefix}-#{connections}.lua", connections, rate * connections.to_f / total)] }
    end

    # Writes at `path` the script of a load of `connections` that starts `rate` requests a second.
    def write(path, connections, rate)
      period = 1000.0 / rate
      FileUtils.mkdir_p(File.dirname(path))
      File.write(path, <<~LUA)
        -- #{connections} connections start a request every #{format("%.4f", period)} ms in all (#{rate.round} a second)
        local ffi = require("ffi")
        ffi.cdef[[
        typedef struct { long tv_sec; long tv_nsec; } soak_timespec;
        int clock_gettime(int clock, soak_timespec *now);
        ]]
        local now = ffi.new("soak_timespec")
        local period = #{period}
        local slot

        local function clock() -- CLOCK_MONOTONIC, in ms
          ffi.C.clock_gettime(1, now)
          return tonumber(now.tv_sec) * 1000 + tonumber(now.tv_nsec) / 1e6
        end

        function delay()
          local t = clock()
          slot = math.max((slot or t) + period, t - 1000)
          return math.max(slot - t, 0)
        end
      LUA
      path
    end
  end
end
