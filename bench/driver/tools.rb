# frozen_string_literal: true

require_relative "wrk_output"

module Bench
  # The tools the scenarios measure with: wrk, perf and strace, a redis-server, and checks that a server still
  # answers. Mixed into Run.
  module Tools
    private

  # wrk's report; wrk itself gets its duration and 30 s more before it is killed and the run fails.
  def wrk(url, connections, seconds, headers, timeout: 5)
    command = [*pin(1), "wrk", "-t1", "-c#{connections}", "-d#{seconds}s", "--latency", "--timeout", "#{timeout}s",
               *headers, url]
    out, status = Open3.popen2e(*command) do |stdin, output, waiter|
      stdin.close
      reader = Thread.new { output.read }
      unless waiter.join(seconds + 30)
        Process.kill(:KILL, waiter.pid)
        waiter.join
        raise Failure, "wrk did not end within #{seconds + 30} s"
      end
      [reader.value, waiter.value]
    end
    raise Failure, "wrk failed: #{out.lines.last}" unless status.success?

    requests = out[/(\d+) requests in/, 1].to_i
    raise Failure, "no request completed" if requests.zero?

    errors = out[/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/] ? Regexp.last_match.captures.sum(&:to_i) : 0
    errors += out[/Non-2xx or 3xx responses: (\d+)/, 1].to_i
    p99 = WrkOutput.p99_ms(out)
    {requests: requests, rps: out[%r{Requests/sec:\s+([\d.]+)}, 1].to_f, p99_ms: p99&.round(2), errors: errors}
  end

  # Calls per request, in all and by call ({name => calls per request}, the most made first), each
  # from separate loads on the warm server. The total is the kernel's count of the
  # raw_syscalls:sys_enter tracepoint over every thread of the server (perf stat: the server runs at
  # full speed), where perf can read it; else strace's. By call from strace -c, which slows the
  # server down: with thousands of connections wrk then times out and reconnects, and strace's
  # total would count the reconnections too. The third value says which tool gave the total.
  # [nil, nil, nil] when neither can run.
  def syscalls_per_request(pid, url, connections, headers)
    counted = perf_syscalls_per_request(pid, url, connections, headers)
    total, by_call = strace_syscalls_per_request(pid, url, connections, headers)
    return [counted, by_call, "perf"] if counted

    [total, by_call, total && "strace"]
  end

  PERF_EVENT = "raw_syscalls:sys_enter"

  # perf stat's count of system calls per request at steady state, or nil where perf cannot count
  # the tracepoint (no perf, no tracefs mounted, perf_event_paranoid). Each wrk run opens its
  # connections and closes them at its end, and each connection costs the server calls of its own
  # (accept, close, a registration, a fiber's stack): thousands of them would fall on the requests,
  # the more so the slower the server. So two loads are counted, one second and 1 + --strace seconds
  # long, with the same connections; their difference in calls over their difference in requests
  # leaves the connections' calls out.
  def perf_syscalls_per_request(pid, url, connections, headers)
    if @perf_counts.nil?
      @perf_counts = system("perf", "stat", "-e", PERF_EVENT, "-x,", "--", "true", out: File::NULL, err: File::NULL)
      note "syscalls/req counted by strace: perf cannot count #{PERF_EVENT} here (is tracefs mounted?)" unless @perf_counts
    end
    return nil unless @perf_counts

    short = perf_count_under_load(pid, url, connections, headers, 1) or return nil
    long = perf_count_under_load(pid, url, connections, headers, 1 + @size[:strace]) or return nil
    requests = long[1] - short[1]
    return nil unless requests.positive? && long[0] >= short[0]

    ((long[0] - short[0]).to_f / requests).round(2)
  end

  # [system calls, requests] of one wrk load of `seconds` on the server, perf attached throughout;
  # nil if perf gave no count.
  def perf_count_under_load(pid, url, connections, headers, seconds)
    log = File.join(ROOT, "tmp/bench/perf.#{pid}")
    perf = Process.spawn("perf", "stat", "-e", PERF_EVENT, "-x,", "-o", log, "-p", pid.to_s, out: File::NULL, err: File::NULL)
    sleep 0.3 # attached
    report = wrk(url, connections, seconds, headers)
    Process.kill(:INT, perf)
    Process.wait(perf)
    count = File.read(log)[/^(\d+),[^,\n]*,#{PERF_EVENT}/o, 1]
    count && [Integer(count), report[:requests]]
  rescue Failure, SystemCallError
    nil
  ensure
    File.delete(log) if log && File.exist?(log)
  end

  # strace -c attached to every thread of the server: [calls per request, by call], or [nil, nil].
  def strace_syscalls_per_request(pid, url, connections, headers)
    tasks = Dir.children("/proc/#{pid}/task").flat_map { |tid| ["-p", tid] }
    log = File.join(ROOT, "tmp/bench/strace.#{pid}")
    strace = Process.spawn("strace", "-c", "-f", "-qq", "-o", log, *tasks, err: File::NULL)
    sleep 0.3 # attached
    report = wrk(url, connections, @size[:strace], headers)
    Process.kill(:INT, strace)
    Process.wait(strace)
    lines = File.readlines(log)
    File.delete(log)
    per_request = ->(fields) { (fields[3].to_f / report[:requests]).round(2) }
    # strace -c's rows: % time, seconds, usecs/call, calls, errors (blank when none), syscall.
    rows = lines.map(&:split).select { |fields| fields.size >= 5 && fields[0].match?(/\A[\d.]+\z/) }
    total = rows.find { |fields| fields.last == "total" }
    by_call = rows.reject { |fields| fields.last == "total" }.to_h { |fields| [fields.last, per_request.call(fields)] }
    [total && per_request.call(total), by_call.select { |_, n| n >= 0.01 }.sort_by { |_, n| -n }.to_h]
  rescue Failure, SystemCallError
    [nil, nil]
  end

  # redis-server on a free loopback port, pinned with the load (CPU 1), no persistence, in a
  # temporary directory; REDIS_KEY set to REDIS_VALUE. stop() ends it.
  def start_redis
    port = TCPServer.open("127.0.0.1", 0) { |probe| probe.local_address.ip_port }
    dir = Dir.mktmpdir("evt-bench-redis-")
    pid = Process.spawn(*pin(1), "redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", dir, "--loglevel", "warning", "--maxclients", [@redis_pool + 64, 10_000].max.to_s,
                        in: File::NULL, out: File::NULL, err: File::NULL, pgroup: true)
    redis = {pid: pid, port: port, dir: dir}
    Timeout.timeout(10) do
      TCPSocket.open("127.0.0.1", port) do |socket|
        socket.write("*3\r\n$3\r\nSET\r\n$#{REDIS_KEY.bytesize}\r\n#{REDIS_KEY}\r\n$#{REDIS_VALUE.bytesize}\r\n#{REDIS_VALUE}\r\n")
        reply = socket.gets
        raise Failure, "redis-server answered SET with #{reply.inspect}" unless reply == "+OK\r\n"
      end
    rescue Errno::ECONNREFUSED
      raise Failure, "redis-server exited" if Process.waitpid(pid, Process::WNOHANG)

      sleep 0.05
      retry
    end
    redis
  rescue Timeout::Error
    stop(redis)
    raise Failure, "redis-server did not start on port #{port}"
  rescue Errno::ENOENT
    raise Failure, "redis-server is not installed (bin/setup installs it)"
  end

  # A GET of +path+ must get the app's answer (+expected+) within +wait+ seconds.
  def answers!(port, context, expected = "hello", wait: FALCON_PROBE, path: "/")
    response = Net::HTTP.start("127.0.0.1", port, open_timeout: wait, read_timeout: wait) { |http| http.get(path) }
    return if response.code == "200" && response.body == expected

    raise Failure, "a GET #{path} #{context} was answered #{response.code} #{response.body.to_s[0, 40].inspect}"
  rescue Net::OpenTimeout, Net::ReadTimeout
    raise Failure, "the server stopped answering: a GET #{context} had no answer in #{wait} s"
  rescue IOError, SystemCallError => e
    raise Failure, "a GET #{context} failed: #{e.class}: #{e.message}"
  end

  # "EPoll" for io-event's selector, "Evt io_uring" for evt's, the scheduler's class for Itsi.
  def short_loop(runs_on)
    runs_on.sub(/\A#<IO::Event::Selector::(\w+).*\z/, '\\1').sub(/\A#<Evt::Selector (\w+).*\z/, 'Evt \\1')
  end
  end
end
