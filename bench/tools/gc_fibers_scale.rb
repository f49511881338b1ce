# frozen_string_literal: true

# What Ruby's garbage collector costs as the number of live fibers grows, with no scheduler and no
# I/O. CRuby's Fiber is not write-barrier protected, so every minor GC marks every live fiber again:
# its VM stack, and its machine stack word by word. A server's garbage (a few objects per request)
# brings minor GCs at the same rate whatever the number of connections, and each then costs in
# proportion to the fibers parked in their waits.
#
# For each N: N fibers parked a few frames deep (as a fiber waiting in a read is), then the main
# fiber makes the same garbage (ALLOCATIONS short strings); the table gives the minor GCs it took,
# the GC's milliseconds per minor GC (GC.stat's time), and the CPU ns per allocation, GC included.
#
#   ruby [--yjit] bench/tools/gc_fibers_scale.rb [N ...]   (default 0 100 1000 8192)
#   ALLOCATIONS=20000000 ruby bench/tools/gc_fibers_scale.rb 8192
sizes = ARGV.empty? ? [0, 100, 1000, 8192] : ARGV.map { |n| Integer(n) }
allocations = Integer(ENV.fetch("ALLOCATIONS", "5000000"))
deep = ->(depth) { depth.zero? ? Fiber.yield : deep.call(depth - 1) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }

puts "Ruby #{RUBY_VERSION}#{" with YJIT" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?}, " \
     "#{allocations} allocations per row"
puts format("%8s %10s %14s %16s", "fibers", "minor GCs", "ms per minor", "CPU ns per alloc")
sizes.each do |n|
  fibers = Array.new(n) { Fiber.new { deep.call(8) } }
  fibers.each(&:resume) # each parked, its stack in use
  GC.start
  minors = GC.stat(:minor_gc_count)
  gc_ms = GC.stat(:time)
  started = cpu.call
  i = 0
  while i < allocations
    "request #{i}" # garbage, as a request makes
    i += 1
  end
  used = cpu.call - started
  minors = GC.stat(:minor_gc_count) - minors
  gc_ms = GC.stat(:time) - gc_ms
  puts format("%8d %10d %14.3f %16.1f", n, minors, minors.zero? ? 0 : gc_ms.to_f / minors, used * 1e9 / allocations)
  fibers.each { |fiber| fiber.resume if fiber.alive? } # ended, before the next row
  fibers = nil
end
