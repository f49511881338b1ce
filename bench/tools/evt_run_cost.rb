# frozen_string_literal: true

# What one `Evt.run { }` costs on each backend, as a Puma request or a Sidekiq job that wraps its
# work in one pays it: a scheduler made (the backend's kernel objects: a ring, an epoll descriptor),
# the block run, the loop run to its end, the scheduler closed. Two blocks: an empty one, and one
# that starts two fibers which each yield once. CPU µs and wall µs per call, after a warm-up.
#
#   ruby [--yjit] bench/tools/evt_run_cost.rb [CALLS]   (default 2000)
require "evt"

calls = Integer(ARGV.fetch(0, "2000"))
blocks = {
  "empty" => -> {},
  "two fibers" => -> { 2.times { Fiber.schedule { sleep 0 } } }
}
clock = ->(id) { Process.clock_gettime(id) }
puts "Evt.run, #{calls} calls each, Ruby #{RUBY_VERSION}#{" with YJIT" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?}"
Evt::Scheduler.availables.each do |backend|
  blocks.each do |name, block|
    10.times { Evt.run(backend: backend, &block) }
    wall = clock.call(Process::CLOCK_MONOTONIC)
    cpu = clock.call(Process::CLOCK_PROCESS_CPUTIME_ID)
    calls.times { Evt.run(backend: backend, &block) }
    cpu = clock.call(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
    wall = clock.call(Process::CLOCK_MONOTONIC) - wall
    puts format("  %-9s %-11s %7.1f CPU µs %7.1f wall µs per call", backend, name, cpu * 1e6 / calls, wall * 1e6 / calls)
  end
end
