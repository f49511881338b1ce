# frozen_string_literal: true

# blocking-ops: FIBERS fibers each deflating MIB MiB with Zlib at once, on evt with its worker pool
# off (every deflate runs on the loop's thread, one after another) or on (Ruby 3.4 hands each to
# blocking_operation_wait, and the pool's threads deflate in parallel); or, for reference, as many
# Ruby threads, no scheduler (zlib releases the GVL). Prints {"seconds", "cpu_seconds"} as JSON.
#
#   ruby bench/scenarios/programs/blocking_ops.rb evt-pool-off|evt-pool-on|threads [FIBERS] [MIB]
require "json"
require "zlib"
require "etc"
require "evt"

subject = ARGV.fetch(0)
pool_size = {"evt-pool-off" => 0, "evt-pool-on" => Etc.nprocessors, "threads" => nil}.fetch(subject) { abort "blocking_ops: unknown subject #{subject}" }
fibers = Integer(ARGV.fetch(1, "16"))
data = Random.new(7).bytes(1 << 20) * Integer(ARGV.fetch(2, "8")) # a repeat 1 MiB apart is past deflate's 32 KiB window: full work
sizes = []

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
if pool_size
  Fiber.set_scheduler(Evt::Scheduler.new(pool_size: pool_size))
  fibers.times { Fiber.schedule { sizes << Zlib::Deflate.deflate(data).bytesize } }
  Fiber.set_scheduler(nil) # runs them all
else
  Array.new(fibers) { Thread.new { sizes << Zlib::Deflate.deflate(data).bytesize } }.each(&:join)
end
seconds = clock.call - started
abort "blocking_ops: #{sizes.size} of #{fibers} deflates finished" if sizes.size != fibers
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: (cpu.call - cpu_started).round(4), fibers: fibers)
