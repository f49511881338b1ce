# frozen_string_literal: true

# Ruby 3.3 and 3.4 built with YJIT (or RJIT) add one to a global counter at every VM instruction
# (rb_vm_insns_count, for --yjit-stats; vm_insnhelper.h's JIT_COLLECT_USAGE_INSN), whether or not
# YJIT runs. Ractors on different cores then fight over that one cache line: here two Ractors each
# doing the same pure-Ruby work take three to four times as long as one, where two processes take as
# long as one. Ruby 4.0 counts only in YJIT stats builds (ruby/ruby#12670). No fiber, no I/O, no evt.
#
#   ruby test/support/ractor_insns_counter.rb   # prints the wall time of each way
Warning[:experimental] = false

# The work of one request of bin/bench's http-cpu (about 0.4 ms).
def work
  total = 0
  9_000.times { |i| total += i * i % 7 }
  total
end

rounds = 1_000
clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
[["1 Ractor", 1, :ractors], ["2 Ractors", 2, :ractors], ["2 processes", 2, :processes]].each do |label, count, kind|
  started = clock.call
  if kind == :ractors
    Array.new(count) { Ractor.new(rounds) { |n| n.times { work } } }.each { |r| r.respond_to?(:value) ? r.value : r.take }
  else
    Array.new(count) { fork { rounds.times { work } } }.each { |pid| Process.wait(pid) }
  end
  printf("%-12s %d x %d works: %.2f s\n", label, count, rounds, clock.call - started)
end
