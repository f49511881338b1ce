# frozen_string_literal: true

# sleep-fanout: work whose fibers mostly sleep a few milliseconds, as an app's fan-outs and pools
# do around short queries; how long it takes is how late the scheduler wakes them, and the CPU it
# spends is what its timers cost while nothing else runs. Three parts, one after the other, each
# a fixed amount of work (SCALE 5, the default: about 2.6 s of sleeping in all):
#
#   timeouts   50 fibers, each 100 * SCALE times a sleep of 2 ms inside two nested Timeout.timeout
#   pool       50 fibers, each 20 * SCALE times taking one of 5 connections from a pool (a Queue),
#              holding it for a 1 ms sleep, giving it back
#   fanout     40 * SCALE rounds of 100 fibers sleeping 1-3 ms each (simulated queries), the round
#              waiting for all of them
#
# Prints {"seconds", "cpu_seconds", "idle_cpu_pct", "<part>_s" for each part} as JSON; idle CPU %
# is CPU time over wall time, which is nearly all waiting here.
#
#   ruby bench/scenarios/programs/sleep_fanout.rb SUBJECT [SCALE]
require "json"
require "timeout"
require_relative "../../subject"

subject = ARGV.fetch(0)
scale = Integer(ARGV.fetch(1, "5"))
random = Random.new(7)
fanout_delays = Array.new(40 * scale) { Array.new(100) { 0.001 + random.rand * 0.002 } }

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
done = Hash.new(0)
parts = {}

timeouts = proc do
  50.times do
    Fiber.schedule do
      (100 * scale).times do
        Timeout.timeout(1) { Timeout.timeout(0.5) { sleep 0.002 } }
        done[:timeouts] += 1
      end
    end
  end
end
pool = proc do
  connections = Thread::Queue.new
  5.times { |i| connections << i }
  50.times do
    Fiber.schedule do
      (20 * scale).times do
        connection = connections.pop
        sleep 0.001
        connections << connection
        done[:pool] += 1
      end
    end
  end
end
fanout = proc do
  Fiber.schedule do
    fanout_delays.each do |delays|
      finished = Thread::Queue.new
      delays.each do |delay|
        Fiber.schedule do
          sleep delay
          finished << true
        end
      end
      delays.size.times { finished.pop }
      done[:fanout] += 1
    end
  end
end

wall_started = clock.call
cpu_started = cpu.call
{timeouts: timeouts, pool: pool, fanout: fanout}.each do |name, part|
  started = clock.call
  Bench::Subject.run(subject, &part)
  parts[:"#{name}_s"] = (clock.call - started).round(4)
end
seconds = clock.call - wall_started
cpu_seconds = cpu.call - cpu_started
expected = {timeouts: 50 * 100 * scale, pool: 50 * 20 * scale, fanout: 40 * scale}
abort "sleep-fanout: done #{done}, expected #{expected}" unless done == expected
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: cpu_seconds.round(4),
                   idle_cpu_pct: (cpu_seconds * 100 / seconds).round(2), **parts)
