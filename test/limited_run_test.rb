# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require_relative "support/limited_run"

# test/support/limited_run.rb, which test/peers/run runs each peer's suite with: a run past its limit
# is stopped with every process it started, and says where each one was waiting.
class LimitedRunTest < Minitest::Test
  def test_a_command_within_its_limit_gives_its_whole_output
    output, stopped, status = LimitedRun.call({ "WORD" => "fine" }, ["sh", "-c", 'echo "$WORD"; echo err >&2; pwd; exit 3'],
                                              dir: Dir.tmpdir, limit: 60)
    refute stopped
    assert_equal ["fine", "err", File.realpath(Dir.tmpdir)], output.lines.map(&:chomp)
    assert_equal 3, status.exitstatus
  end

  # What test/stress/run lists and kills when a program hangs: the processes it started, and theirs.
  def test_descendants_are_the_processes_a_process_started_and_theirs
    reader, writer = IO.pipe
    pid = Process.spawn("sh", "-c", "sh -c 'sleep 300 & echo sleeper $!; wait' & echo inner $!; wait", out: writer)
    writer.close
    said = Array.new(2) { reader.gets.split }.to_h # in either order
    inner, sleeper = said.fetch("inner").to_i, said.fetch("sleeper").to_i
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30 # until the sleeper has become sleep
    sleep 0.01 until File.binread("/proc/#{sleeper}/cmdline").start_with?("sleep") || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    assert_equal [inner, sleeper].sort, (LimitedRun.descendants(pid) & [inner, sleeper]).sort
    refute_includes LimitedRun.descendants(pid), pid
    assert_equal [], LimitedRun.descendants(sleeper)
    listed = LimitedRun.describe([sleeper, inner])
    lines = listed.lines.map(&:chomp)
    assert_equal 2, lines.size, listed
    assert_equal 1, lines.grep(/\A  #{inner} [RS] \[#{inner}:\S+\] sh -c sleep 300 & echo sleeper \$!; wait\z/).size, listed
    assert_equal 1, lines.grep(/\A  #{sleeper} [RS] \[#{sleeper}:\S+\] sleep 300\z/).size, listed
  ensure
    [sleeper, inner, pid].compact.each { |each| Process.kill(:KILL, each) rescue SystemCallError } # rubocop:disable Style/RescueModifier
    Process.wait(pid) if pid
    reader&.close
  end

  def test_a_hung_command_is_stopped_with_its_children_and_their_waits_listed
    Dir.mktmpdir do |dir|
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      # A child that ignores TERM, as a deadlocked one would not hear it: KILL must follow.
      output, stopped = LimitedRun.call({}, ["sh", "-c", "echo begun; sh -c 'trap \"\" TERM; sleep 300' & sleep 300"],
                                        dir: dir, limit: 3, grace: 1)
      took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      assert stopped
      assert_operator took, :<, 60, "stopped within the limit and the grace times"
      assert_match(/\Abegun\n/, output)
      assert_match(/^processes still running/, output)
      sleeps = output.lines.grep(/\A  \d+ S \[\d+:[^\]]*\] sleep 300$/)
      assert_equal 2, sleeps.size, output # both sleeps, each with its kernel wait
      assert_match(/\(stopped after 3 s\)\n\z/, output)
      pids = output.scan(/^  (\d+) /).flatten.map(&:to_i)
      refute_empty pids
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30 # a killed process takes a moment to end
      sleep 0.05 until pids.none? { |pid| running?(pid) } || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      pids.each { |pid| refute running?(pid), "#{pid} still runs" }
    end
  end

  def test_a_command_that_leaves_a_child_holding_its_output_is_stopped_too
    Dir.mktmpdir do |dir|
      # The command ends at once, in any encoding; the child it leaves keeps the output open.
      output, stopped = LimitedRun.call({}, ["sh", "-c", "printf '\\360\\237\\244\\224 done\\n\\377\\n'; sleep 300 &"],
                                        dir: dir, limit: 3, grace: 1)
      assert stopped
      assert_equal Encoding::UTF_8, output.encoding
      assert output.valid_encoding?
      assert_equal "\u{1F914} done\n\u{FFFD}\n", output.lines.first(2).join
      assert_equal 1, output.lines.grep(/ sleep 300$/).size, output
    end
  end

  # test/peers/run's second run for a suite stopped by Ruby 3.4's fork hang: only a process with one
  # thread, in a futex wait, on 3.4.
  def test_rubys_fork_hang_is_one_thread_in_a_futex_wait_on_ruby_3_4
    stuck = "  4242 S [4242:futex_do_wait] /usr/bin/ruby sus\n"
    listing = "processes still running (pid, state, [thread:kernel wait], command):\n" \
              "  4200 S [4200:do_epoll_wait 4201:futex_do_wait] /usr/bin/ruby sus\n#{stuck}\n(stopped after 3 s)\n"
    assert_equal stuck, LimitedRun.rubys_fork_hang(listing, ruby: "3.4.5")
    assert_nil LimitedRun.rubys_fork_hang(listing, ruby: "4.0.0")
    assert_nil LimitedRun.rubys_fork_hang(listing, ruby: "3.3.8")
    two_threads = listing.sub(stuck, "  4242 S [4242:futex_do_wait 4243:do_epoll_wait] /usr/bin/ruby sus\n")
    assert_nil LimitedRun.rubys_fork_hang(two_threads, ruby: "3.4.5")
    other_wait = listing.sub(stuck, "  4242 S [4242:pipe_read] /usr/bin/ruby sus\n")
    assert_nil LimitedRun.rubys_fork_hang(other_wait, ruby: "3.4.5")
  end

  def running?(pid)
    !File.read("/proc/#{pid}/stat").split(") ").last.start_with?("Z")
  rescue Errno::ENOENT, Errno::ESRCH
    false
  end
end
