# frozen_string_literal: true

# Ruby's own fork hang, without evt: threads that go in and out of blocking calls (sleep) while the
# main thread forks. On Ruby 3.4 a child now and then never runs: it waits, with one thread, in a
# futex, for the interrupt_lock of a parent's thread that held it at the fork (thread_cleanup_func
# takes it to free the thread's interrupt_exec tasks). Ruby 4.0 initializes those locks in the child
# first; Ruby 3.3 does not take them. The stress tester's fork_child notes such a child as Ruby's
# (Stress.stuck_in_rubys_fork).
#
#   ruby test/stress/ruby_fork_hang.rb [FORKS] [THREADS]      (default 3000 forks, 2 threads)
#
# Prints each stuck child (it is killed), then "RUBY_VERSION: N forks, N children stuck". A stuck
# child is rare: one in a few thousand forks on 3.4.5 here; none in 15,000 on 4.0.0 (6 threads).
$stdout.sync = true
forks = Integer(ARGV[0] || 3000)
threads = Integer(ARGV[1] || 2)
threads.times { Thread.new { loop { sleep 0.00001 } } }
stuck = 0
forks.times do |i|
  pid = fork { exit!(0) }
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
  until Process.wait(pid, Process::WNOHANG)
    if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      stuck += 1
      wchan = File.read("/proc/#{pid}/wchan") rescue "?" # rubocop:disable Style/RescueModifier
      puts "fork #{i}: child #{pid} stuck (#{Dir["/proc/#{pid}/task/*"].size} thread, kernel wait #{wchan}): killed"
      Process.kill(:KILL, pid)
      Process.wait(pid)
      break
    end
    sleep 0.001
  end
end
puts "#{RUBY_VERSION}: #{forks} forks, #{stuck} children stuck"
