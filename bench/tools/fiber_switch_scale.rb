# frozen_string_literal: true

# What a fiber switch costs in Ruby itself as the number of live fibers grows, with no scheduler and
# no I/O: N fibers, each given a stack a little deeper than an idle one, resumed round-robin, each
# yielding straight back. CPU ns per resume-and-yield, for each N. At thousands of fibers each
# switch lands on a stack the CPU's caches no longer hold, which is part of what every fiber
# scheduler pays per request at 8,192 connections and a server of callbacks does not.
#
#   ruby [--yjit] bench/tools/fiber_switch_scale.rb [N ...]   (default 100 1000 8192)
sizes = ARGV.empty? ? [100, 1000, 8192] : ARGV.map { |n| Integer(n) }
deep = ->(depth) { depth.zero? ? Fiber.yield : deep.call(depth - 1) }
sizes.each do |n|
  fibers = Array.new(n) { Fiber.new { loop { deep.call(8) } } }
  rounds = [2_000_000 / n, 20].max
  fibers.each(&:resume) # every fiber has a stack now
  started = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  rounds.times { fibers.each(&:resume) }
  used = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - started
  puts format("%s%s %6d fibers: %.0f CPU ns per switch and back", RUBY_VERSION,
              defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? " YJIT" : "", n, used * 1e9 / (rounds * n))
end
