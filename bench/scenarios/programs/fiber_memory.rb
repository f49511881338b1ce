# frozen_string_literal: true

# fiber-memory: what one waiting fiber costs. FIBERS fibers started and left waiting, all alive at
# once: first half of them sleeping (sleep 3600), then the other half reading sockets that never
# get data (100 readers on each of FIBERS / 200 UNIX socket pairs). The process's RSS before and
# after each half, over the fibers of that half. Then it prints and ends the process at once (the
# fibers never wake).
# Prints {"bytes_per_fiber" (both halves), "sleeping_bytes", "socket_bytes", "rss_mb", "fibers"}
# as JSON.
#
#   ruby bench/scenarios/programs/fiber_memory.rb SUBJECT [FIBERS]
require "json"
require "socket"
require_relative "../../subject"

subject = ARGV.fetch(0)
count = Integer(ARGV.fetch(1, "100000"))
half = count / 2
pairs = Array.new([half / 100, 1].max) { UNIXSocket.pair }
rss = -> { GC.start; Bench::Subject.rss_mb("VmRSS") * 1024 * 1024 }

Bench::Subject.run(subject) do
  before = rss.call
  half.times { Fiber.schedule { sleep 3600 } }
  sleeping = rss.call
  half.times { |i| Fiber.schedule { pairs[i % pairs.size].first.read(1) } }
  reading = rss.call
  puts JSON.generate(bytes_per_fiber: ((reading - before) / (2 * half)).round, sleeping_bytes: ((sleeping - before) / half).round,
                     socket_bytes: ((reading - sleeping) / half).round, rss_mb: (reading / 1024.0 / 1024).round(1), fibers: 2 * half)
  $stdout.flush
  exit!(0)
end
abort "fiber-memory: the subject's loop ended before the fibers were measured"
