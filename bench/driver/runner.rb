# frozen_string_literal: true

module Bench
  # The runner: the subjects' processes (started, pinned, stopped), what /proc says of them, and the
  # driver's own output. Mixed into Run.
  module Runner
    private

  # A server in a process group of its own, pinned to CPU 0 unless told otherwise; it prints
  # "listening on PORT" (that line is server[:line]). +mode+ "r+" gives its stdin too; +err+ is
  # where its stderr goes; +env+ is added to the bench's environment (nil unsets).
  def start_server(command, pinned: true, mode: "r", err: File::NULL, env: {})
    stdout = IO.popen(bench_env.merge(env), [*(pinned ? pin(0) : []), *command], mode, chdir: ROOT, err: err, pgroup: true)
    server = {pid: stdout.pid, stdout: stdout}
    line = server[:line] = Timeout.timeout(30) { stdout.gets }
    server[:port] = line && line[/listening on (\d+)/, 1] or raise Failure, "the server did not start"
    server
  rescue StandardError
    stop(server)
    raise
  end

  # Ends a server (or redis-server) and its process group.
  def stop(server)
    return unless server

    begin
      Process.kill(:KILL, -server[:pid])
    rescue Errno::ESRCH
      nil
    end
    server[:stdout]&.close
    Process.wait(server[:pid]) unless server[:stdout]
    FileUtils.rm_rf(server[:dir]) if server[:dir]
  rescue Errno::ECHILD
    nil
  end

  # Whether the server's process has ended (a zombie or gone): only then is there a death to report.
  def ended?(server)
    return false unless server

    File.read("/proc/#{server[:pid]}/stat").split(") ").last.split.first == "Z"
  rescue SystemCallError
    true
  end

  # A scenario script, pinned to CPU 0 unless it is about using every core; one that has not ended
  # within +limit+ seconds is killed (its process group with it) and fails its row.
  def script(name, subject, *arguments, pinned: true, limit: 600)
    command = [*(pinned ? pin(0) : []), *ruby_for(subject), "bench/scenarios/programs/#{name}", subject, *arguments.map(&:to_s)]
    out, err, status = Open3.popen3(bench_env, *command, chdir: ROOT, pgroup: true) do |stdin, stdout, stderr, waiter|
      stdin.close
      # Quiet: a row that times out closes the pipes under them as it raises.
      readers = [stdout, stderr].map { |io| Thread.new { Thread.current.report_on_exception = false; io.read } }
      unless waiter.join(limit)
        Process.kill(:KILL, -waiter.pid)
        waiter.join
        raise Failure, "#{name} did not end within #{limit} s"
      end
      [*readers.map(&:value), waiter.value]
    end
    raise Failure, first_error(err, status) unless status.success?

    JSON.parse(out.lines.last, symbolize_names: true)
  end

  def ruby
    [RbConfig.ruby, *("--yjit" if @options[:yjit]), "-I#{ROOT}/lib"]
  end

  # async's gems come from the Gemfile's optional :bench group; everything else needs only lib/.
  def ruby_for(subject)
    subject.start_with?("async-") || %w[carbon uringmachine].include?(subject) ? [*ruby, "-rbundler/setup"] : ruby
  end

  def bench_env
    {"BUNDLE_WITH" => "bench", "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile")}
  end

  # Every server and wrk inherit this process's descriptor limit: raised, up to the hard limit
  # (and the hard limit itself where we may), when the connections need more. {before:, after:, note:}.
  def descriptor_limit
    soft, hard = Process.getrlimit(:NOFILE)
    needed = @connections + SPARE_DESCRIPTORS
    return {before: soft, after: soft, note: "descriptor limit #{soft}: enough for #{@connections} connections"} if soft >= needed

    begin
      Process.setrlimit(:NOFILE, needed, [hard, needed].max)
    rescue Errno::EPERM
      Process.setrlimit(:NOFILE, hard, hard)
    end
    after = Process.getrlimit(:NOFILE).first
    {before: soft, after: after,
     note: "descriptor limit raised from #{soft} to #{after} for #{@connections} connections" \
           "#{" (too few: the hard limit is #{hard}, and only root may raise it)" if after < needed}"}
  end

  # Whether the Ruby under test runs fibers in several Ractors at once (Evt::Workers says).
  def parallel_ractors?
    @parallel_ractors = Open3.capture2(*ruby, "-revt", "-e", "print Evt::Workers::PARALLEL_RACTOR_FIBERS").first == "true" if @parallel_ractors.nil?
    @parallel_ractors
  end

  # The line of a failed process's stderr that says what went wrong.
  def first_error(err, status)
    line = err.lines.find { |l| l =~ /Error|error|abort/ } || err.lines.last
    (line || "exited with status #{status.exitstatus}").strip
  end

  def pin(cpu)
    @cores >= 2 ? ["taskset", "-c", cpu.to_s] : []
  end

  # CPU seconds of every process in process group +pgid+ (a supervisor and its workers).
  def group_cpu_seconds(pgid)
    Dir.glob("/proc/[0-9]*/stat").sum do |path|
      fields = File.read(path).split(") ").last.split
      Integer(fields[2]) == pgid ? (Integer(fields[11]) + Integer(fields[12])).fdiv(HZ) : 0
    rescue SystemCallError
      0 # ended meanwhile
    end
  end

  # The resident memory of every process of the group, summed (pages forked processes share count
  # once per process, as the processes' own figures do).
  def group_rss_mb(pgid)
    Dir.glob("/proc/[0-9]*/stat").sum do |path|
      Integer(File.read(path).split(") ").last.split[2]) == pgid ? proc_rss_mb(path[%r{/proc/(\d+)/}, 1]) : 0
    rescue SystemCallError
      0 # ended meanwhile
    end
  end

  def proc_rss_mb(pid)
    File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+) kB/, 1].to_i / 1024.0
  end

  # The part of a process's RSS that it gave back with madvise(MADV_FREE): pages Linux leaves mapped
  # and counts in RSS until it needs memory, then takes without writing them anywhere. Ruby frees
  # the stacks of ended fibers this way, so after a peak of live fibers RSS keeps that peak's
  # stacks. 0 where smaps_rollup (Linux 4.14) or its LazyFree line (4.12) is missing.
  def proc_lazy_free_mb(pid)
    File.read("/proc/#{pid}/smaps_rollup")[/^LazyFree:\s+(\d+) kB/, 1].to_i / 1024.0
  rescue Errno::ENOENT, Errno::EACCES
    0.0
  end

  # [steal, all] ticks so far of CPU +cpu+ (nil: every CPU) from /proc/stat: steal is the time the
  # hypervisor ran something else while this machine had work for the CPU.
  def cpu_steal_ticks(cpu)
    fields = File.read("/proc/stat")[/^cpu#{cpu} (.*)$/, 1].split.map { |field| Integer(field) }
    [fields[7] || 0, fields.first(8).sum]
  end

  def cpu_seconds(pid)
    fields = File.read("/proc/#{pid}/stat").split(") ").last.split
    (Integer(fields[11]) + Integer(fields[12])).fdiv(HZ)
  end

  # Every fiber stack is a mapping (and its guard page another): 100,000 sleeping fibers need
  # more than the default vm.max_map_count of 65,530.
  def ensure_map_count(fibers)
    needed = fibers * 3 + 65_530
    current = Integer(File.read("/proc/sys/vm/max_map_count"))
    return if current >= needed

    if system("sysctl", "-q", "-w", "vm.max_map_count=#{needed}", out: File::NULL, err: File::NULL)
      note "  raised vm.max_map_count from #{current} to #{needed} for #{fibers} fibers (sysctl)"
    else
      note "  vm.max_map_count is #{current}: #{fibers} fibers may hit FiberError (raise it with sysctl as root)"
    end
  end

  def stderr_lines(log)
    File.exist?(log) ? File.readlines(log, chomp: true) : []
  end

  # The Failure of a server's measurement that +error+ ended: +reason+ (else the error's first
  # line), with the first error line of the server's stderr (+log+) and the start of that stderr.
  def server_failure(error, log, reason = nil)
    reason ||= error.message.lines.first.strip
    first = stderr_lines(log).find { |l| l =~ /Error|error|abort|\[BUG\]/ }
    reason += " (stderr: #{first.strip})" if first && !reason.include?(first.strip)
    Failure.new(reason, stderr: stderr_lines(log).first(20), stderr_file: relative(log))
  end

  def progress(subject)
    started = clock
    $stderr.print format("  %-13s running...", subject)
    result = yield
    $stderr.print format("\r  %-13s %5.1f s%s\n", subject, clock - started, result[:error] ? " (failed)" : "")
    result
  rescue StandardError
    $stderr.print format("\r  %-13s %5.1f s (failed)\n", subject, clock - started)
    raise
  end

  def note(message)
    $stderr.puts message
  end

  def clock
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def relative(path)
    path.delete_prefix("#{ROOT}/")
  end
  end
end
