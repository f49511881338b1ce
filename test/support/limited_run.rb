# frozen_string_literal: true

# A command run within a time limit, for test/peers/run, the stress tester and the Itsi test: its
# output (stdout and stderr together), and when it is still going at the limit, a list of every
# process of its group with the kernel wait each thread sits in, taken before the group is stopped
# (TERM, then KILL), so a hang says where it was: evt's loop, a forked child, a lock.
module LimitedRun
  # Seconds given after TERM, after KILL, for the command to be reaped, and to a process that keeps
  # the output open after it (a process that left the group is not waited for longer).
  GRACE = 10

  module_function

  # @return [Array(String, Boolean, Process::Status)] the output (UTF-8, scrubbed), whether it was
  #   stopped, and how the command ended (nil when it was not reaped)
  def call(env, command, dir:, limit:, grace: GRACE)
    output = String.new(encoding: Encoding::BINARY)
    status = nil
    reader, writer = IO.pipe
    begin
      pid = Process.spawn(env, *command, chdir: dir, out: writer, err: writer, pgroup: true)
    ensure
      writer.close
    end
    collector = Thread.new do
      output << reader.readpartial(65_536) while true
    rescue EOFError, IOError
      nil # the end, or the reader closed below
    end
    begin
      stopped = !collector.join(limit)
      stop(pid, output, limit) { collector.join(grace) } if stopped
      pid = nil if (status = reaped(pid, grace))
    ensure
      if pid # not reaped (an exception, or a process that does not end): what is left goes, unwaited
        signal(:KILL, pid)
        Process.detach(pid)
      end
      collector.join(grace)
      reader.close # ends a collector still reading (a process that left the group holds the pipe)
      collector.join
    end
    [output.dup.force_encoding(Encoding::UTF_8).scrub, stopped, status]
  end

  # The group's processes listed into `output`, then TERM, then KILL, until the block says the
  # output ended.
  def stop(pid, output, limit)
    output << "\n".b << processes(pid) << "\n(stopped after #{limit} s)\n".b
    %i[TERM KILL].each do |name|
      break unless signal(name, pid)
      break if yield
    end
  end

  # Sends `name` to the group `pid` leads: false when none of it is left.
  def signal(name, pid)
    Process.kill(name, -pid)
    true
  rescue Errno::ESRCH
    false
  end

  # `pid`'s status once it ended within `seconds`, reaped; else nil.
  def reaped(pid, seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    until (status = Process::Status.wait(pid, Process::WNOHANG))
      return nil if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
    status
  end

  # The line of a stopped command's process list (#processes) that shows a child stuck in Ruby 3.4's
  # own fork, or nil: on Ruby 3.4 (`ruby`), a process with one thread, in a futex wait. Every Ruby
  # process past its start has a second thread (the timer thread); a child forked while another
  # thread of its parent went in or out of a blocking call waits before that, for ever, on a lock
  # of that thread's (docs/behaviour.md, Ruby versions).
  def rubys_fork_hang(output, ruby: RUBY_VERSION)
    return nil unless ruby.start_with?("3.4.")

    output.lines.find { |line| line.match?(/\A  (\d+) S \[\1:futex\w*\] /) }
  end

  # One line per process of the group `pgid`: pid, state, [thread:kernel wait ...], command (bytes:
  # a command line may be in any encoding).
  def processes(pgid)
    "processes still running (pid, state, [thread:kernel wait], command):\n".b +
      describe(table.select { |_, (_, _, group)| group == pgid }.keys)
  end

  # The processes `pid` started, and theirs, that are still there.
  def descendants(pid)
    children = table.each_with_object(Hash.new { |hash, key| hash[key] = [] }) { |(each, (_, parent)), by| by[parent] << each }
    found = []
    pending = [pid]
    until pending.empty?
      found.concat(kids = children[pending.shift])
      pending.concat(kids)
    end
    found
  end

  # Every process now: pid => [state, parent pid, group] (bytes).
  def table
    Dir["/proc/[0-9]*/stat"].filter_map do |stat|
      fields = File.binread(stat).split(") ".b).last.split # after "pid (comm)": state, ppid, pgrp, ...
      [File.basename(File.dirname(stat)).to_i, [fields[0], fields[1].to_i, fields[2].to_i]]
    rescue Errno::ENOENT, Errno::ESRCH
      nil # ended meanwhile
    end.to_h
  end

  # One line per process of `pids` still there: pid, state, [thread:kernel wait ...], command.
  def describe(pids)
    lines = pids.sort.filter_map do |pid|
      dir = "/proc/#{pid}"
      state = File.binread("#{dir}/stat").split(") ".b).last.split.first
      threads = Dir["#{dir}/task/*/wchan"].map { |wchan| "#{wchan.split("/")[-2]}:".b + File.binread(wchan) }
      command = File.binread("#{dir}/cmdline").tr("\0".b, " ".b).strip[0, 120]
      ["  ".b, pid.to_s.b, " ".b, state, " [".b, threads.join(" ".b), "] ".b, command].join
    rescue Errno::ENOENT, Errno::ESRCH
      nil # ended meanwhile
    end
    lines.join("\n".b)
  end
end
