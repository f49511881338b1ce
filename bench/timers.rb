# frozen_string_literal: true

# timers: FIBERS fibers each sleeping a random 0-100 ms (the same delays for every subject).
# Prints {"seconds", "cpu_seconds", "rss_mb" (peak)} as JSON.
#
#   ruby bench/timers.rb SUBJECT [FIBERS]
require "json"
require_relative "subject"

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
abort "timers: #{finished} of #{count} fibers finished" if finished != count
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: (cpu.call - cpu_started).round(4),
                   rss_mb: Bench::Subject.rss_mb("VmHWM").round(1))
