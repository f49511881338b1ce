# frozen_string_literal: true

# Ruby 3.3 and 3.4 crash (a segmentation fault, most runs) when fibers start and end in two Ractors
# at once, with no scheduler and no evt: every fiber takes its stack from one pool (cont.c's
# shared_fiber_pool) that those Rubies change without a lock. Fixed in Ruby 4.0 by ruby/ruby#13466
# ("Take VM lock around manipulation of fiber pool for vacant stacks"). A Fiber Scheduler runs every
# scheduled fiber on that pool, so no scheduler can run loops in several Ractors at once there.
#
#   ruby test/support/ractor_fibers_crash.rb [RACTORS]   # prints "ok: ..." when it does not crash
Warning[:experimental] = false
ractors = Integer(ARGV.fetch(0, "2"))
running = Array.new(ractors) do
  Ractor.new do
    started = 0
    20_000.times { Fiber.new { started += 1 }.resume }
    started
  end
end
puts "ok: #{running.map { |r| r.respond_to?(:value) ? r.value : r.take }.sum} fibers in #{ractors} Ractors"
