# frozen_string_literal: true

# blocking-ops: FIBERS fibers each deflating MIB MiB with Zlib at once, on evt with its worker pool
# off (every deflate runs on the loop's thread, one after another) or on (Ruby 3.4 hands each to
# blocking_operation_wait, and the pool's threads deflate in parallel). Prints {"seconds",
# "cpu_seconds"} as JSON.
#
#   ruby bench/blocking_ops.rb evt-pool-off|evt-pool-on [FIBERS] [MIB]
require "json"
require "zlib"
require "etc"
require "evt"

subject = ARGV.fetch(0)
pool_size = {"evt-pool-off" => 0, "evt-pool-on" => Etc.nprocessors}.fetch(subject) { abort "blocking_ops: unknown subject #{subject}" }
fibers = Integer(ARGV.fetch(1, "16"))
data = Random.new(7).bytes(1 << 20) * Integer(ARGV.fetch(2, "8")) # compressible: the same MiB over and over
sizes = []

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
scheduler = Evt::Scheduler.new(pool_size: pool_size)
Fiber.set_scheduler(scheduler)
fibers.times { Fiber.schedule { sizes << Zlib::Deflate.deflate(data).bytesize } }
Fiber.set_scheduler(nil) # runs them all
seconds = clock.call - started
abort "blocking_ops: #{sizes.size} of #{fibers} deflates finished" if sizes.size != fibers
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: (cpu.call - cpu_started).round(4), fibers: fibers)
