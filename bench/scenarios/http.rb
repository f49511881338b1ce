# frozen_string_literal: true

module Bench
  scenario "http-keepalive",
           metric: :cpu_us_per_req,
           note: "(syscalls/req: the kernel's count (perf stat of raw_syscalls:sys_enter) over two separate runs, " \
                 "1 s and 1 + 1-2 s, their difference in calls over their difference in requests, so that opening " \
                 "and closing the connections is left out; else strace -c -f's over one run, which slows the server " \
                 "down; syscalls_counted_by in the JSON says which; the calls by name: another run under strace)"
  scenario "http-close", metric: :cpu_us_per_req
  scenario "http-redis",
           metric: :cpu_us_per_req,
           note: "(each request's handler does one GET through a redis-client pool (connection_pool) to a real " \
                 "redis-server, which runs on CPU 1 with wrk; a request waiting for the pool is woken by every " \
                 "connection returned to it (connection_pool's broadcast), so many more connections than the pool " \
                 "has cost every subject that; threads: a thread per " \
                 "connection; the answer is the value read, checked by a GET after the warm-up and after the run; " \
                 "a handler's error ends its connection and counts as wrk's error; x best peer is CPU us/req, " \
                 "req/s x peer is req/s over the best peer's by req/s)"
  scenario "http-cpu",
           metric: :cpu_us_per_req,
           note: "(Evt::Workers: evt-workers-N processes, evt-ractors-N Ractors of one process; each worker listens on " \
                 "a socket of its own at the port (SO_REUSEPORT, Linux), so the kernel splits wrk's connections evenly; not pinned: " \
                 "they may use every core; wrk pinned to CPU 1; CPU us/req counts every worker; RSS MB: the resident memory of the " \
                 "server's processes (supervisor and workers) summed, at the run's end)"

  # http-redis: the connections in the redis-client pool every server's requests share (unless
  # --redis-pool says otherwise), and the value they read (seeded before each run; every check GET
  # must get it back as the body). A check GET may wait REDIS_PROBE seconds: it queues for the pool
  # behind every request the server still holds.
  REDIS_POOL = 32
  REDIS_PROBE = 30
  REDIS_KEY = "evt:bench:greeting"
  REDIS_VALUE = "Hello from Redis\n"

  # http-keepalive, http-close, http-redis and http-cpu: an HTTP server per subject under wrk.
  module HttpScenarios
    private

  def http(subject, keepalive:)
    # One connection at a time cannot keep 100 keep-alive connections: the rest would starve.
    connections = %w[blocking fibers].include?(subject) && keepalive ? 1 : @connections
    server = start_server(C_SERVERS.key?(subject) ? [@c_servers.fetch(subject)] : [*ruby_for(subject), "bench/servers/http_server.rb", subject])
    begin
      url = "http://127.0.0.1:#{server[:port]}/"
      headers = keepalive ? [] : ["-H", "Connection: close"]
      wrk(url, connections, @size[:warmup], headers)
      before = cpu_seconds(server[:pid])
      report = wrk(url, connections, @size[:duration], headers)
      used = cpu_seconds(server[:pid]) - before
      figures = {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2),
                 p99_ms: report[:p99_ms], errors: report[:errors], connections: connections}
      figures[:syscalls_per_req], figures[:syscalls_by_call], figures[:syscalls_counted_by] =
        syscalls_per_request(server[:pid], url, connections, headers)
      figures
    ensure
      stop(server)
    end
  end

  # http-cpu: evt-workers-N (processes) and evt-ractors-N (Ractors of one process), under the same
  # load; the CPU time of every worker counts.
  def http_cpu(subject)
    workers = Integer(subject[/\d+\z/])
    kind = subject.start_with?("evt-ractors-") ? "ractors" : "processes"
    server = start_server([*ruby, "bench/servers/http_cpu_server.rb", workers.to_s, kind], pinned: false)
    begin
      url = "http://127.0.0.1:#{server[:port]}/"
      wrk(url, @connections, @size[:warmup], [])
      before = group_cpu_seconds(server[:pid])
      report = wrk(url, @connections, @size[:duration], [])
      used = group_cpu_seconds(server[:pid]) - before
      {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2), p99_ms: report[:p99_ms],
       errors: report[:errors], rss_mb: group_rss_mb(server[:pid]).round(1), workers: workers, connections: @connections}
    ensure
      stop(server)
    end
  end

  # One server for +subject+ reading REDIS_KEY from a fresh redis-server per GET, under wrk's
  # keep-alive load after the warm-up; a GET after each wrk run checks the answer. The server's
  # stderr (the handlers' errors) goes to tmp/bench/http-redis.<subject>.stderr.
  def http_redis(subject)
    log = File.join(ROOT, "tmp/bench/http-redis.#{subject}.stderr")
    FileUtils.mkdir_p(File.dirname(log))
    redis = start_redis
    server = start_server([*ruby, "-rbundler/setup", "bench/servers/http_redis_server.rb", subject, redis[:port].to_s, @redis_pool.to_s],
                          err: log)
    url = "http://127.0.0.1:#{server[:port]}/"
    warmup = wrk(url, @connections, @size[:warmup], [])
    answers!(server[:port], "after #{warmup[:requests]} requests in the warm-up", REDIS_VALUE, wait: REDIS_PROBE)
    before = cpu_seconds(server[:pid])
    report = wrk(url, @connections, @size[:duration], [])
    used = cpu_seconds(server[:pid]) - before
    answers!(server[:port], "after #{report[:requests]} requests in the run", REDIS_VALUE, wait: REDIS_PROBE)
    {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2), p99_ms: report[:p99_ms],
     errors: report[:errors], connections: @connections, pool: @redis_pool}
  rescue Failure => e
    first = stderr_lines(log).first
    raise Failure.new([e.message, first && "(stderr: #{first.strip})"].compact.join(" "), stderr_file: relative(log))
  ensure
    stop(server)
    stop(redis)
  end
  end
end
