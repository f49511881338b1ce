# frozen_string_literal: true

module Bench
  scenario "pipe-pingpong", metric: :seconds
  scenario "big-reads", metric: :cpu_seconds
  scenario "write-pieces",
           metric: :split_ms,
           note: "(the server answers each request with io.write(head, body), or with io.write(head + body); " \
                 "Ruby without a scheduler sends either in one system call: a scheduler sending the two strings " \
                 "as two TCP segments makes the second wait for the client's delayed ACK, ~40 ms)"
  scenario "timers",
           metric: :seconds,
           note: "(peak RSS counts the fibers alive at once: a scheduler that starts them faster has more " \
                 "of them overlapping within the 100 ms; late us: median wall time past the requested sleep of one " \
                 "fiber sleeping 1, 2 and 5 ms in turn, 300 sleeps, alone in its loop; idle CPU %: that process's CPU " \
                 "time over the wall time of those sleeps, which a scheduler that spins for timers spends)"
  scenario "thread-server",
           metric: :seconds,
           note: "(fiber clients on the subject's scheduler download 256 KiB bodies with Net::HTTP, read_body in " \
                 "chunks, from a server of plain threads in the same process: the loop's thread and the server's " \
                 "share the GVL; unpinned; threads: both sides plain threads)"
  scenario "thread-clients",
           metric: :seconds,
           note: "(the same with the roles swapped: a fiber server on the subject's scheduler, plain-thread clients)"
  scenario "sleep-fanout",
           metric: :seconds,
           note: "(fibers that mostly sleep 1-3 ms: nested Timeout.timeout around sleeps, a pool of 5 held across " \
                 "sleeps, rounds of 100 sleeping fibers; seconds: all three parts, which sleep about 2.6 s; idle CPU %: " \
                 "CPU time over wall time, nearly all of it waiting)"
  scenario "fiber-memory",
           metric: :bytes_per_fiber,
           note: "(bytes of RSS per fiber alive and waiting: half of them sleeping, half reading sockets that get no " \
                 "data, 100 readers a socket; what Ruby's fiber and its stack take and what the scheduler keeps per wait)"
  scenario "idle-connections", metric: :rss_mb
  scenario "close-waiters",
           metric: :close_avg_us,
           note: "(us: IO#close's average time per IO; woken: readers the closes themselves ended with " \
                 "IOError, of N; HANG: the rest never woke)"
  scenario "blocking-ops",
           metric: :seconds,
           note: "(Ruby 3.4 hands each deflate to blocking_operation_wait: pool-on runs them on a thread per core; " \
                 "threads: one Ruby thread per deflate, no scheduler, for reference; a full run runs each " \
                 "subject 3 times, in fresh processes, and shows the median run)"

  # close-waiters: seconds one point may take (a few at most; a scheduler can hang in close itself).
  CLOSE_WAITERS_LIMIT = 60

  # The scenarios that run a script per subject and read its figures: pipe-pingpong, big-reads,
  # write-pieces (Run#script), timers, idle-connections, close-waiters, blocking-ops.
  module ProcessScenarios
    private

  # blocking-ops: the run with the median time of @size[:repeats], each in a fresh process, and
  # every run's seconds (a single run's time moves too much on a shared machine).
  def blocking_ops(subject)
    runs = Array.new(@size[:repeats]) do
      script("blocking_ops.rb", subject, @size[:deflates], @size[:deflate_mib], pinned: false)
    end
    runs.sort_by { |run| run[:seconds] }[runs.size / 2].merge(runs: runs.map { |run| run[:seconds] })
  end

  # thread-server, thread-clients: both sides in one process, unpinned (the GVL passes between
  # the loop's thread and the others as on a user's machine).
  def threads_beside(subject, role)
    script("threads_beside.rb", subject, role, @size[:beside_clients], @size[:beside_rounds], pinned: false)
  end

  def timers(subject)
    fibers = @size[:fibers]
    ensure_map_count(fibers)
    script("timers.rb", subject, fibers).merge(fibers: fibers)
  end

  def fiber_memory(subject)
    fibers = @size[:fibers]
    ensure_map_count(fibers)
    script("fiber_memory.rb", subject, fibers, pinned: false, limit: 180)
  end

  def idle(subject)
    count = @size[:idle]
    log = File.join(ROOT, "tmp/bench/idle.#{subject}.stderr")
    FileUtils.mkdir_p(File.dirname(log))
    server = start_server([*ruby_for(subject), "bench/servers/idle_server.rb", subject, count.to_s], err: log)
    client = IO.popen([*ruby, "bench/clients/idle_client.rb", server[:port].to_s, count.to_s], "r+", chdir: ROOT, err: File::NULL)
    begin
      line = Timeout.timeout(120) { server[:stdout].gets }
      unless line&.start_with?("{")
        first = stderr_lines(log).find { |l| l =~ /Error|error|abort|\[BUG\]/ }
        raise Failure, "the server did not report#{" (stderr: #{first.strip[0, 160]})" if first}"
      end

      JSON.parse(line, symbolize_names: true)
    ensure
      client.close_write
      client.close
      stop(server)
    end
  end

  # N readers blocked on N pipes, every read end closed from another fiber (thread): a process per
  # N. The script stops waiting for readers after a second and says so; a scheduler whose close
  # wakes nobody is reported as a hang, not waited for.
  def close_waiters(subject)
    points = @size[:waiters].map do |n|
      script("close_waiters.rb", subject, n, limit: CLOSE_WAITERS_LIMIT)
    rescue Failure, Timeout::Error => e
      {n: n, error: e.message.lines.first.strip}
    end
    measured = points.select { |p| p[:close_avg_us] }
    raise Failure, points.first[:error] if measured.empty?

    last = measured.last
    {points: points, n: last[:n], close_avg_us: last[:close_avg_us], woken: last[:woken], hang: points.any? { |p| p[:hang] },
     flat: measured.size > 1 ? (last[:close_avg_us] / measured.first[:close_avg_us]).round(2) : nil}
  end
  end
end
