# frozen_string_literal: true

require "test_helper"
require "rbconfig"
require_relative "support/limited_run"
require_relative "stress/program"

# The stress tester (test/stress/): random concurrent programs whose outcome is known before they
# run, on this run's backend, for EVT_STRESS_SECONDS (bin/test: a minute on every backend of the
# newest Ruby, 20 s on the others; 20 s alone). The programs start from a seed made from minitest's,
# so a run is repeated by its seed; a failing or hung program is printed with the command that
# reruns it alone. The run itself has a limit (its seconds, a program's limit, a margin): past it, or
# when a process it started still holds its output, the processes left are listed with their kernel
# waits and stopped (test/support/limited_run.rb), and the test fails with what the run printed.
# bin/stress is the long campaign.
class StressTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  # Seconds before a program counts as hung (test/stress/run --limit).
  PROGRAM_LIMIT = 30

  def test_random_programs_get_their_known_outcomes
    seconds = Float(ENV.fetch("EVT_STRESS_SECONDS", "20"))
    seed = Minitest.seed * 1000
    command = [RbConfig.ruby, "-W0", "-I#{File.join(ROOT, "lib")}", File.join(ROOT, "test/stress/run"),
               "--seed", seed.to_s, "--seconds", seconds.to_s, "--limit", PROGRAM_LIMIT.to_s]
    out, stopped, status = LimitedRun.call({ "RUBYOPT" => nil }, command, dir: ROOT, limit: seconds + PROGRAM_LIMIT + 30)
    refute stopped, "test/stress/run was stopped at its limit:\n#{out}"
    summary = out[/^stress: (\d+) programs, (\d+) failed, (\d+) hung .*$/]
    assert summary, "test/stress/run ended without its summary (status #{status.inspect}):\n#{out}"
    ran, failed, hung = Regexp.last_match.captures.map(&:to_i)
    assert_operator ran, :>, 0, out
    assert_equal [0, 0], [failed, hung], out
    assert status&.success?, "status #{status.inspect}:\n#{out}"
  end

  # fork_child's allowance for Ruby's fork hang (Stress.stuck_in_rubys_fork): only a child that
  # never took its title, with one thread, in a futex wait.
  def test_only_a_child_stuck_before_its_block_in_a_futex_is_taken_for_rubys_fork_hang
    parents = "ruby\0test/stress/run\0--seed\0".b
    assert Stress.rubys_fork_hang?(parents, "futex_do_wait", 1)
    refute Stress.rubys_fork_hang?("#{Stress::CHILD_TITLE}\0".b, "futex_do_wait", 1), "past fork: evt's"
    refute Stress.rubys_fork_hang?(parents, "futex_do_wait", 2), "a child with its timer thread is past fork"
    refute Stress.rubys_fork_hang?(parents, "pipe_read", 1)
  end

  def test_a_forked_child_past_its_fork_is_not_taken_for_rubys_hang
    skip "no /proc here" unless File.directory?("/proc/self")
    reader, writer = IO.pipe
    pid = fork do
      Process.setproctitle(Stress::CHILD_TITLE)
      writer.close
      reader.read # waits until the test closes its end
      exit!(0)
    end
    reader.close
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    until File.binread("/proc/#{pid}/cmdline").start_with?(Stress::CHILD_TITLE)
      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        rubys = Stress.stuck_in_rubys_fork(pid) # this fork, too, may meet Ruby's hang
        skip rubys if rubys
        flunk "the child never took its title"
      end
      sleep 0.01
    end
    assert_nil Stress.stuck_in_rubys_fork(pid)
    assert_nil Stress.stuck_in_rubys_fork(Process.pid), "the test's process has more than one thread"
  ensure
    writer&.close
    if pid
      Process.kill(:KILL, pid)
      Process.wait(pid)
    end
  end
end
