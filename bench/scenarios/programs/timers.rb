# frozen_string_literal: true

# timers: FIBERS fibers each sleeping a random 0-100 ms (the same delays for every subject); then
# one fiber alone sleeping 1, 2 and 5 ms in turn, LATENESS_ROUNDS times, for how late a sleep wakes
# and what an idle sleeper costs.
# Prints {"seconds", "cpu_seconds", "rss_mb" (peak), "late_us" (median), "late_p99_us", "idle_cpu_pct"}
# as JSON.
#
#   ruby bench/scenarios/programs/timers.rb SUBJECT [FIBERS]
require "json"
require_relative "../../subject"

LATENESS_DELAYS = [0.001, 0.002, 0.005].freeze
LATENESS_ROUNDS = 100

subject = ARGV.fetch(0)
count = Integer(ARGV.fetch(1, "100000"))
random = Random.new(42)
delays = Array.new(count) { random.rand * 0.1 }
finished = 0

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
Bench::Subject.run(subject) do
  delays.each do |delay|
    Fiber.schedule do
      sleep delay
      finished += 1
    end
  end
end
seconds = clock.call - started
cpu_seconds = cpu.call - cpu_started
abort "timers: #{finished} of #{count} fibers finished" if finished != count

# Lateness: wall time past the requested sleep, with nothing else running in the loop.
late = []
lateness_wall = lateness_cpu = 0
Bench::Subject.run(subject) do
  wall_before = clock.call
  cpu_before = cpu.call
  LATENESS_ROUNDS.times do
    LATENESS_DELAYS.each do |delay|
      before = clock.call
      sleep delay
      late << (clock.call - before - delay)
    end
  end
  lateness_wall = clock.call - wall_before
  lateness_cpu = cpu.call - cpu_before
end
late.sort!
abort "timers: a sleep woke #{(-late.first * 1e6).round(1)} us early" if late.first.negative?
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: cpu_seconds.round(4),
                   rss_mb: Bench::Subject.rss_mb("VmHWM").round(1),
                   late_us: (late[late.size / 2] * 1e6).round(1), late_p99_us: (late[(late.size * 0.99).floor] * 1e6).round(1),
                   idle_cpu_pct: (lateness_cpu * 100 / lateness_wall).round(2))
