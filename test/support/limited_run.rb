# frozen_string_literal: true

# A command run within a time limit, for test/peers/run: its output (stdout and stderr together),
# and when it is still going at the limit, a list of every process of its group with the kernel wait
# each thread sits in, taken before the group is stopped (TERM, then KILL), so a hang says where it
# was: evt's loop, a forked child, a lock.
module LimitedRun
  # Seconds between TERM and KILL, and the longest wait for the output of a process that left the group.
  GRACE = 10

  module_function

  # @return [Array(String, Boolean)] the output (UTF-8, scrubbed) and whether it was stopped
  def call(env, command, dir:, limit:, grace: GRACE)
    reader, writer = IO.pipe
    pid = Process.spawn(env, *command, chdir: dir, out: writer, err: writer, pgroup: true)
    writer.close
    output = +""
    collector = Thread.new do
      output << reader.readpartial(65_536) while true
    rescue EOFError, IOError
      nil
    end
    stopped = !collector.join(limit)
    if stopped
      output << "\n#{processes(pid)}\n(stopped after #{limit} s)\n"
      %w[TERM KILL].each do |signal|
        Process.kill(signal, -pid)
        break if collector.join(grace)
      rescue Errno::ESRCH
        break
      end
    end
    Process.wait(pid)
    collector.join(grace)
    [output.force_encoding(Encoding::UTF_8).scrub, stopped]
  ensure
    reader&.close
    collector&.join
  end

  # One line per process of the group `pgid`: pid, state, [thread:kernel wait ...], command.
  def processes(pgid)
    lines = Dir["/proc/[0-9]*/stat"].sort.filter_map do |stat|
      fields = File.read(stat).split(") ").last.split # after "pid (comm)": state, ppid, pgrp, ...
      next unless fields[2].to_i == pgid

      dir = File.dirname(stat)
      threads = Dir["#{dir}/task/*/wchan"].map { |wchan| "#{wchan.split("/")[-2]}:#{File.read(wchan)}" }
      command = File.read("#{dir}/cmdline").tr("\0", " ").strip[0, 120]
      "  #{File.basename(dir)} #{fields[0]} [#{threads.join(" ")}] #{command}"
    rescue Errno::ENOENT, Errno::ESRCH
      nil # ended meanwhile
    end
    "processes still running (pid, state, [thread:kernel wait], command):\n#{lines.join("\n")}"
  end
end
