# frozen_string_literal: true

# bin/bench's driver: every scenario against every subject, each subject a fresh process, figures
# comparable within one run. See bin/bench --help.
require "etc"
require "fileutils"
require "json"
require "net/http"
require "open3"
require "optparse"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"
require_relative "chart"
require_relative "soak"
require_relative "rails"

module Bench
  ROOT = File.expand_path("..", __dir__)
  SCENARIOS = %w[http-keepalive http-close http-redis pipe-pingpong big-reads write-pieces timers idle-connections
                 close-waiters blocking-ops http-cpu falcon rails].freeze
  # Scenarios that run only when --only names them: soak takes 10 minutes per backend.
  ON_REQUEST = %w[soak].freeze
  # Scenarios about evt's use of every core, with subjects of their own (evt configured two ways).
  CORE_SUBJECTS = {"blocking-ops" => ->(_cores) { %w[evt-pool-off evt-pool-on threads] },
                   "http-cpu" => ->(cores) { ["evt-workers-1", "evt-workers-#{cores}", "evt-ractors-1", "evt-ractors-#{cores}"] }}.freeze
  PEERS = %w[blocking threads async-epoll async-uring carbon uringmachine].freeze
  # http-redis: the connections in the redis-client pool every server's requests share (unless
  # --redis-pool says otherwise), and the value they read (seeded before each run; every check GET
  # must get it back as the body). A check GET may wait REDIS_PROBE seconds: it queues for the pool
  # behind every request the server still holds.
  REDIS_POOL = 32
  REDIS_PROBE = 30
  REDIS_KEY = "evt:bench:greeting"
  REDIS_VALUE = "Hello from Redis\n"
  # wrk's connections in the HTTP scenarios, unless --connections says otherwise.
  CONNECTIONS = 100
  # Descriptors a process needs besides one per connection (its own files, the pool, wrk's threads).
  SPARE_DESCRIPTORS = 1024
  # falcon: Rack servers on a fiber scheduler, with subjects of their own: Falcon on io-event's
  # selectors and on evt's (IO_EVENT_SELECTOR=Evt), and Itsi with async's scheduler and evt's.
  FALCON_SUBJECTS = %w[falcon-epoll falcon-uring falcon-evt falcon-evt-epoll itsi-async itsi-evt].freeze
  # falcon's apps (bench/rack_apps.rb), a table each: name => title.
  FALCON_APPS = {"hello" => "hello", "sleep" => "sleep 1 ms"}.freeze
  # falcon: the rows each server's evt rows are compared with (the best of them).
  FALCON_BASELINES = {"falcon" => %w[falcon-epoll falcon-uring], "itsi" => %w[itsi-async]}.freeze
  # falcon: seconds a GET waits for its answer after each wrk run, and wrk's --timeout: a server that
  # stops answering fails its row rather than hanging it or passing with a few requests.
  FALCON_PROBE = 2
  HZ = Etc.sysconf(Etc::SC_CLK_TCK)
  # Each scenario's figure (lower is better): what --repeat takes the median run by, and the ratios use.
  METRICS = {"http-keepalive" => :cpu_us_per_req, "http-close" => :cpu_us_per_req, "http-redis" => :cpu_us_per_req,
             "pipe-pingpong" => :seconds, "big-reads" => :cpu_seconds, "write-pieces" => :split_ms, "timers" => :seconds,
             "idle-connections" => :rss_mb, "close-waiters" => :close_avg_us, "blocking-ops" => :seconds,
             "http-cpu" => :cpu_us_per_req, "falcon" => :cpu_us_per_req,
             "rails" => :cpu_us_per_req}.freeze
  # close-waiters: seconds one point may take (a few at most; a scheduler can hang in close itself).
  CLOSE_WAITERS_LIMIT = 60

  # Sizes: the full run, and --quick (the whole suite in about two minutes, half of it falcon).
  SIZES = {
    full: {duration: 5, warmup: 1, strace: 2, pairs: 50, messages: 10_000, fibers: 100_000, idle: 10_000,
           waiters: [10, 100, 1000, 8000], deflates: 16, deflate_mib: 8, repeats: 3, soak: 600, rounds: 50,
           big_clients: 20, big_rounds: 20},
    quick: {duration: 1, warmup: 1, strace: 1, pairs: 10, messages: 2_000, fibers: 10_000, idle: 1_000,
            waiters: [10, 100, 1000], deflates: 4, deflate_mib: 2, repeats: 1, soak: 30, rounds: 20,
            big_clients: 5, big_rounds: 5},
  }.freeze

  # soak's HTTP load: two wrk at once, [connections, headers].
  SOAK_LOAD = [[50, []], [20, ["-H", "Connection: close"]]].freeze
  # soak's targets: RSS at the last row within this many % of the first row's.
  SOAK_RSS_PERCENT = 5.0
  # soak: seconds bin/bench waits for the server's answer to a sample (it may itself wait up to
  # Soak::SETTLE_LIMIT for its fibers to park) before it calls the server hung.
  SOAK_ANSWER = 60
  # soak: the server's counters that must grow in every row (an activity that stops is an error).
  SOAK_ACTIVITIES = {requests: "HTTP", pipes: "pipes", sleeps: "sleeps", timeouts: "timeouts", queued: "queues",
                     closes: "closes"}.freeze
  # soak's rows: [key, title, width, format].
  SOAK_COLUMNS = [[:t_s, "t s", 5, "%d"], [:requests, "requests", 9, "%d"], [:errors, "errors", 7, "%d"],
                  [:rss_mb, "RSS MB", 7, "%.1f"], [:fds, "fds", 5, "%d"], [:cpu_pct, "CPU %", 6, "%.1f"],
                  [:pipes, "pipes", 8, "%d"], [:sleeps, "sleeps", 8, "%d"], [:timeouts, "timeouts", 9, "%d"],
                  [:queued, "queued", 8, "%d"], [:closes, "closes", 7, "%d"], [:late_ms, "late ms", 8, "%.1f"]].freeze

  NOTES = {
    "timers" => "(peak RSS counts the fibers alive at once: a scheduler that starts them faster has more " \
                "of them overlapping within the 100 ms; late us: median wall time past the requested sleep of one " \
                "fiber sleeping 1, 2 and 5 ms in turn, 300 sleeps, alone in its loop; idle CPU %: that process's CPU " \
                "time over the wall time of those sleeps, which a scheduler that spins for timers spends)",
    "soak" => "(requests: served, by the server's count; errors: wrk's socket errors and non-2xx, every check the " \
              "server makes that failed (message content and order, sleeps or timeouts ending early, Timeout not " \
              "firing, waiters a close did not end with IOError, any other exception, a fiber stalled " \
              "#{Soak::STALL_LIMIT.to_i} s) and each activity that made no progress in a row; RSS, fds and CPU from /proc " \
              "at the end of each row, with the HTTP connections ended, the fibers that open and close pipes " \
              "parked where they hold the same ones (so flat means the same count at every row), and " \
              "Process.warmup run (full GC, compaction, malloc_trim: RSS is what stays, not garbage or memory " \
              "malloc keeps free); late ms: the latest a sleeper woke in the row)",
    "write-pieces" => "(the server answers each request with io.write(head, body), or with io.write(head + body); " \
                      "Ruby without a scheduler sends either in one system call: a scheduler sending the two strings " \
                      "as two TCP segments makes the second wait for the client's delayed ACK, ~40 ms)",
    "http-keepalive" => "(syscalls/req: a separate 1-2 s run under strace -c -f, which slows the server down)",
    "http-redis" => "(each request's handler does one GET through a redis-client pool (connection_pool) to a real " \
                    "redis-server, which runs on CPU 1 with wrk; a request waiting for the pool is woken by every " \
                    "connection returned to it (connection_pool's broadcast), so many more connections than the pool " \
                    "has cost every subject that; threads: a thread per " \
                    "connection; the answer is the value read, checked by a GET after the warm-up and after the run; " \
                    "a handler's error ends its connection and counts as wrk's error; x best peer is CPU us/req, " \
                    "req/s x peer is req/s over the best peer's by req/s)",
    "close-waiters" => "(us: IO#close's average time per IO; woken: readers the closes themselves ended with " \
                       "IOError, of N; HANG: the rest never woke)",
    "blocking-ops" => "(Ruby 3.4 hands each deflate to blocking_operation_wait: pool-on runs them on a thread per core; " \
                      "threads: one Ruby thread per deflate, no scheduler, for reference; a full run runs each " \
                      "subject 3 times, in fresh processes, and shows the median run)",
    "http-cpu" => "(Evt::Workers: evt-workers-N processes, evt-ractors-N Ractors of one process; not pinned: " \
                  "they may use every core; wrk pinned to CPU 1; CPU us/req counts every worker; RSS MB: the resident memory of the " \
                  "server's processes (supervisor and workers) summed, at the run's end)",
    "falcon" => "(one server process, one Ruby thread, pinned to CPU 0; CPU us/req counts the server's process " \
                "group; falcon-*: Falcon::Server as a `falcon serve` worker runs it, without the supervisor, on " \
                "io-event's EPoll or URing selector or on evt's (IO_EVENT_SELECTOR=Evt with RUBYOPT=-revt/async; " \
                "falcon-evt on evt's default backend, falcon-evt-epoll with EVT_BACKEND=epoll); itsi-*: the itsi " \
                "command, workers 1, threads 1, fiber_scheduler Async::Scheduler (io-event's default selector) or " \
                "Evt::Scheduler; x io-event: CPU us/req, and req/s, over the same server's best io-event row; " \
                "a server that stops answering fails its row; its stderr: tmp/bench/falcon.<subject>.<app>.stderr)",
  }.freeze

  # A measurement that failed; +details+ go into its row (a server's stderr, say).
  class Failure < StandardError
    attr_reader :details

    def initialize(message = nil, details = {})
      super(message)
      @details = details
    end
  end

  # One benchmark run: options in, tables on stdout, JSON and SVG out.
  class Run
    include RailsScenario

    def initialize(argv)
      @options = {quick: false, json: File.join(ROOT, "bench/results/latest.json"),
                  svg: File.join(ROOT, "bench/results/latest.svg"), only: SCENARIOS, subjects: nil, duration: nil, repeat: 1, yjit: false}
      begin
        parse(argv)
      rescue OptionParser::ParseError => e
        abort "bin/bench: #{e.message} (bin/bench --help)"
      end
      @size = SIZES.fetch(@options[:quick] ? :quick : :full).dup
      @size[:duration] = @options[:duration] if @options[:duration]
      @size[:soak] = @options[:soak] if @options[:soak]
      @connections = @options[:connections] || CONNECTIONS
      @redis_pool = @options[:redis_pool] || REDIS_POOL
      @cores = Etc.nprocessors
      @results = []
      @started = clock
    end

    def call
      subjects = available_subjects
      note "evt bench: Ruby #{RUBY_VERSION}#{" with YJIT" if @options[:yjit]}, #{@cores} cores, " \
           "#{@options[:quick] ? "quick" : "full"} run"
      note "server pinned to CPU 0 and load to CPU 1" if @cores >= 2
      @descriptors = descriptor_limit
      note @descriptors[:note]
      @options[:only].each do |scenario|
        note ""
        note "== #{scenario}"
        own = subjects_for(scenario, subjects)
        variants(scenario).each do |app|
          note "  -- #{scenario == "rails" ? RailsScenario::APPS.fetch(app)[1] : FALCON_APPS.fetch(app)}" if app
          @results.concat(measure_rounds(scenario, own, app))
        end
        add_ratios(scenario) unless scenario == "soak"
        print_table(scenario)
      end
      written = write_outputs
      note format("\ndone in %.0f s: %s", clock - @started, written.map { |f| relative(f) }.join(", "))
    end

    private

    def parse(argv)
      OptionParser.new do |o|
        o.banner = "usage: bin/bench [options]"
        o.on("--quick", "the whole suite in about two minutes, smaller sizes") { @options[:quick] = true }
        o.on("--json FILE", "write the results here (bench/results/latest.json)") { |f| @options[:json] = File.expand_path(f) }
        o.on("--svg FILE", "write the chart here (bench/results/latest.svg)") { |f| @options[:svg] = File.expand_path(f) }
        o.on("--only SCENARIO[,..]", Array, "scenarios: #{SCENARIOS.join(", ")} (all of them by default);",
             "falcon: Falcon and Itsi serving a Rack app (hello; sleep 1 ms) on io-event's selectors and evt's;",
             "rails: a Rails app (a 50 ms query; an instant answer) under Puma, and Falcon on io-event's and evt's;",
             "soak runs only when named here: mixed load for 10 minutes on each C backend (30 s with --quick)") do |list|
          unknown = list - SCENARIOS - ON_REQUEST
          raise OptionParser::InvalidArgument, "unknown scenario #{unknown.join(", ")}" unless unknown.empty?

          @options[:only] = list
        end
        o.on("--subjects NAME[,..]", Array, "subjects to run (default: all); falcon's own: #{FALCON_SUBJECTS.join(", ")}") do |list|
          @options[:subjects] = list
        end
        o.on("--duration S", Integer, "whole seconds each HTTP measurement lasts (not soak's)") do |s|
          raise OptionParser::InvalidArgument, "duration must be positive" unless s.positive?

          @options[:duration] = s
        end
        o.on("--connections N", Integer, "wrk's connections in the HTTP scenarios (#{CONNECTIONS}); the descriptor",
             "limit is raised to fit, and the output says so") do |n|
          raise OptionParser::InvalidArgument, "connections must be positive" unless n.positive?

          @options[:connections] = n
        end
        o.on("--redis-pool N", Integer, "http-redis: connections in the server's Redis pool (#{REDIS_POOL})") do |n|
          raise OptionParser::InvalidArgument, "the pool needs at least one connection" unless n.positive?

          @options[:redis_pool] = n
        end
        o.on("--yjit", "run every Ruby subject with YJIT (--yjit), as production Ruby usually runs") do
          @options[:yjit] = true
        end
        o.on("--repeat N", Integer, "run each scenario N times, the subjects taking turns, and show each",
             "subject's median run (by the scenario's metric); every run's figure is kept") do |n|
          raise OptionParser::InvalidArgument, "repeat must be positive" unless n.positive?

          @options[:repeat] = n
        end
        o.on("--soak-duration S", Integer, "seconds soak lasts per backend (600; 30 with --quick);",
             "a row every 60 s, or every 5 s under 2 minutes") do |s|
          raise OptionParser::InvalidArgument, "soak needs at least 10 s (two rows)" unless s >= 10

          @options[:soak] = s
        end
      end.parse!(argv)
    end

    # [[name, nil or why it cannot run]], in table order.
    def available_subjects
      subjects = [["c-epoll", c_server_problem], ["blocking", nil], ["threads", nil]]
      subjects += evt_backends.map { |name| ["evt-#{name}", nil] }
      async = async_problems
      subjects += %w[async-epoll async-uring].map { |name| [name, async[name]] }
      subjects << ["carbon", carbon_problem]
      subjects << ["uringmachine", uringmachine_problem]
      if @options[:subjects]
        unknown = @options[:subjects] - subjects.map(&:first) - CORE_SUBJECTS.values.flat_map { |names| names.call(@cores) } -
                  FALCON_SUBJECTS - rails_subject_names
        abort "bin/bench: unknown subject #{unknown.join(", ")}; subjects: #{subjects.map(&:first).join(", ")}" if unknown.any?
        subjects.select! { |name, _| @options[:subjects].include?(name) }
      end
      subjects
    end

    # The core scenarios' own subjects (those --subjects names, if it names any of them).
    def subjects_for(scenario, subjects)
      return soak_subjects if scenario == "soak"
      return falcon_subjects if scenario == "falcon"
      return rails_subjects if scenario == "rails"

      own = CORE_SUBJECTS[scenario] or return subjects
      names = own.call(@cores)
      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      names.map { |name| [name, nil] }
    end

    def evt_backends
      out, status = Open3.capture2(*ruby, "-e", 'require "evt"; puts Evt::Scheduler.availables')
      abort "bin/bench: evt does not load" unless status.success?
      out.split
    end

    def c_server_problem
      @c_server = File.join(ROOT, "tmp/bench/c_epoll_server")
      source = File.join(ROOT, "bench/reference/c_epoll_server.c")
      Dir.mkdir(File.dirname(@c_server)) unless Dir.exist?(File.dirname(@c_server))
      return nil if File.exist?(@c_server) && File.mtime(@c_server) >= File.mtime(source)

      out, status = Open3.capture2e("cc", "-O2", "-Wall", "-o", @c_server, source)
      status.success? ? nil : "does not build: #{out.lines.first&.strip}"
    end

    def async_problems
      check = 'require "async"; require "io/event"; puts IO::Event::Selector.constants.grep(/EPoll|URing/)'
      out, err, status = Open3.capture3(bench_env, *ruby, "-rbundler/setup", "-e", check)
      unless status.success?
        reason = "async is not installed (#{err.lines.grep(/Error|error/).first&.strip || "bundle install --with bench"})"
        return {"async-epoll" => reason, "async-uring" => reason}
      end
      selectors = out.split
      {"async-epoll" => selectors.include?("EPoll") ? nil : "io-event has no EPoll selector here",
       "async-uring" => selectors.include?("URing") ? nil : "io-event was built without liburing"}
    end

    # Carbon Fiber: Ruby 3.4 or later, its native extension (not its pure-Ruby fallback), its io_uring loop.
    def carbon_problem
      return "carbon_fiber needs Ruby 3.4 or later" if RUBY_VERSION < "3.4"

      check = 'require "carbon_fiber"; abort "its native extension did not load: pure-Ruby fallback" unless ' \
              'CarbonFiber::Native.available?; CarbonFiber::Scheduler.new.close'
      _, err, status = Open3.capture3(bench_env, *ruby, "-rbundler/setup", "-e", check)
      return nil if status.success?

      "Carbon Fiber does not run here: #{err.lines.grep(/Error|error|abort|fallback/).first&.strip || err.lines.last&.strip}"
    end

    # uringmachine's fiber scheduler (UringMachine::FiberScheduler): Ruby 4.0 or later, io_uring.
    def uringmachine_problem
      return "uringmachine needs Ruby 4.0 or later" if RUBY_VERSION < "4"

      check = 'require "uringmachine"; require "uringmachine/fiber_scheduler"; UM::FiberScheduler.new(UM.new)'
      _, err, status = Open3.capture3(bench_env, *ruby, "-rbundler/setup", "-e", check)
      return nil if status.success?

      "uringmachine does not run here: #{err.lines.grep(/Error|error/).first&.strip || err.lines.last&.strip}"
    end

    # The app variants a scenario runs each subject with (falcon's apps), or [nil].
    def variants(scenario)
      case scenario
      when "falcon" then FALCON_APPS.keys
      when "rails" then RailsScenario::APPS.keys
      else [nil]
      end
    end

    # A scenario's rows for one app: each subject measured --repeat times, in rounds (every subject
    # once per round, so that the machine's drift falls on all of them alike), and the run with the
    # median metric kept, with every run's figure in :repeat_runs. A subject that fails any run fails its row.
    def measure_rounds(scenario, subjects, app)
      repeat = scenario == "soak" ? 1 : @options[:repeat]
      runs = Array.new(repeat) do |round|
        note "  round #{round + 1} of #{repeat}" if repeat > 1
        subjects.map { |subject, unavailable| measure(scenario, subject, unavailable, app) }
      end
      return runs.first if repeat == 1

      key = metric(scenario)
      runs.transpose.map do |each_run|
        failed = each_run.find { |row| row[:error] || row[:skipped] }
        next failed.merge(failed_runs: each_run.count { |row| row[:error] }) if failed

        median = each_run.sort_by { |row| row[key] }[each_run.size / 2]
        median.merge(repeat_runs: each_run.map { |row| row[key] })
      end
    end

    def measure(scenario, subject, unavailable, app = nil)
      row = {scenario: scenario, subject: subject}
      row[:app] = app if app
      return row.merge(skipped: unavailable) if unavailable

      reason = not_applicable(scenario, subject)
      return row.merge(skipped: reason) if reason
      return row.merge(soak(subject)) if scenario == "soak" # it reports its progress row by row

      progress(app ? "#{subject} #{app}" : subject) do
        figures = case scenario
                  when "http-keepalive" then http(subject, keepalive: true)
                  when "http-close" then http(subject, keepalive: false)
                  when "http-redis" then http_redis(subject)
                  when "pipe-pingpong" then script("pipe_pingpong.rb", subject, @size[:pairs], @size[:messages])
                  when "big-reads" then script("big_reads.rb", subject, @size[:big_clients], @size[:big_rounds])
                  when "write-pieces" then script("write_pieces.rb", subject, @size[:rounds])
                  when "timers" then timers(subject)
                  when "idle-connections" then idle(subject)
                  when "close-waiters" then close_waiters(subject)
                  when "blocking-ops" then blocking_ops(subject)
                  when "http-cpu" then http_cpu(subject)
                  when "falcon" then falcon(subject, app)
                  when "rails" then rails(subject, app)
                  end
        row.merge(figures)
      end
    rescue Failure, Timeout::Error, SystemCallError => e
      row.merge(error: e.message.lines.first.strip, **(e.is_a?(Failure) ? e.details : {}))
    end

    def not_applicable(scenario, subject)
      if scenario == "http-redis"
        return "the C server has no Redis client" if subject == "c-epoll"
        return "one connection at a time: threads is the scheduler-less row" if subject == "blocking"
      end
      if scenario == "http-cpu" && subject.start_with?("evt-ractors-") && Integer(subject[/\d+\z/]) > 1 && !parallel_ractors?
        return "Ruby #{RUBY_VERSION} crashes with fibers in two Ractors at once (ruby/ruby#13466)"
      end
      return nil if scenario.start_with?("http-") || CORE_SUBJECTS.key?(scenario) || %w[falcon rails].include?(scenario)
      return "an HTTP server only" if subject == "c-epoll"
      return "one thread cannot block on several readers" if scenario == "close-waiters" && subject == "blocking"
      return "one thread cannot serve and read at once" if scenario == "big-reads" && subject == "blocking"
      return "one thread cannot hold #{@size[:idle]} waiting connections" if scenario == "idle-connections" && subject == "blocking"
      return "#{@size[:fibers]} sleepers need fibers or as many threads" if scenario == "timers" && %w[blocking threads].include?(subject)

      nil
    end

    # ---- HTTP ----------------------------------------------------------------------------------

    def http(subject, keepalive:)
      # One connection at a time cannot keep 100 keep-alive connections: the rest would starve.
      connections = subject == "blocking" && keepalive ? 1 : @connections
      server = start_server(subject == "c-epoll" ? [@c_server] : [*ruby_for(subject), "bench/http_server.rb", subject])
      begin
        url = "http://127.0.0.1:#{server[:port]}/"
        headers = keepalive ? [] : ["-H", "Connection: close"]
        wrk(url, connections, @size[:warmup], headers)
        before = cpu_seconds(server[:pid])
        report = wrk(url, connections, @size[:duration], headers)
        used = cpu_seconds(server[:pid]) - before
        figures = {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2),
                   p99_ms: report[:p99_ms], errors: report[:errors], connections: connections}
        figures[:syscalls_per_req] = syscalls_per_request(server[:pid], url, connections, headers)
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
      server = start_server([*ruby, "bench/http_cpu_server.rb", workers.to_s, kind], pinned: false)
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

    # ---- http-redis ----------------------------------------------------------------------------

    # One server for +subject+ reading REDIS_KEY from a fresh redis-server per GET, under wrk's
    # keep-alive load after the warm-up; a GET after each wrk run checks the answer. The server's
    # stderr (the handlers' errors) goes to tmp/bench/http-redis.<subject>.stderr.
    def http_redis(subject)
      log = File.join(ROOT, "tmp/bench/http-redis.#{subject}.stderr")
      FileUtils.mkdir_p(File.dirname(log))
      redis = start_redis
      server = start_server([*ruby, "-rbundler/setup", "bench/http_redis_server.rb", subject, redis[:port].to_s, @redis_pool.to_s],
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

    # ---- falcon ----------------------------------------------------------------------------------

    # falcon's subjects, with why one cannot run: the gems missing (the :bench group), the selector
    # io-event lacks, the backend evt lacks. That evt/async loads is not checked here: a selector that
    # fails to load fails its rows, with the server's stderr.
    def falcon_subjects
      names = FALCON_SUBJECTS
      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      problems = falcon_problems
      names.map { |name| [name, problems[name]] }
    end

    def falcon_problems
      check = <<~'RUBY'
        problems = {}
        begin
          require "falcon/server"
          require "io/event"
          selectors = IO::Event::Selector.constants
          problems["falcon-epoll"] = "io-event has no EPoll selector here" unless selectors.include?(:EPoll)
          problems["falcon-uring"] = "io-event was built without liburing" unless selectors.include?(:URing)
        rescue LoadError => e
          %w[falcon-epoll falcon-uring falcon-evt falcon-evt-epoll].each { |name| problems[name] = "falcon does not load (#{e.message})" }
        end
        begin
          Gem.bin_path("itsi-server", "itsi")
          require "itsi/server"
          require "async"
        rescue LoadError, Gem::Exception => e
          %w[itsi-async itsi-evt].each { |name| problems[name] = "itsi-server does not load (#{e.message})" }
        end
        puts JSON.generate(problems)
      RUBY
      out, err, status = Open3.capture3(bench_env, *ruby, "-rbundler/setup", "-rjson", "-e", check, chdir: ROOT)
      unless status.success?
        reason = "the bench gems are not installed (#{err.lines.grep(/Error|error/).first&.strip || "bundle install --with bench"})"
        return FALCON_SUBJECTS.to_h { |name| [name, reason] }
      end
      problems = JSON.parse(out.lines.last)
      if RUBY_VERSION < "3.3"
        FALCON_SUBJECTS.grep(/\Afalcon-/).each { |name| problems[name] ||= "falcon 0.57 needs Ruby 3.3 or later" }
      end
      problems["falcon-evt-epoll"] ||= "evt has no epoll backend here" unless evt_backends.include?("epoll")
      problems
    end

    # [command, environment, the loop the server must say it runs on, that loop's name] for a falcon
    # subject.
    def falcon_server(subject, app)
      case subject
      when /\Afalcon-(epoll|uring)\z/
        selector = Regexp.last_match(1) == "epoll" ? "EPoll" : "URing"
        [[*ruby, "-rbundler/setup", "bench/falcon_server.rb", app], {"IO_EVENT_SELECTOR" => selector},
         /\A#<IO::Event::Selector::#{selector}\b/, "io-event's #{selector}"]
      when /\Afalcon-evt(?:-(\w+))?\z/
        # How an application switches: the selector's name, and evt/async loaded before async makes it.
        backend = Regexp.last_match(1)
        env = {"IO_EVENT_SELECTOR" => "Evt", "EVT_BACKEND" => backend,
               "RUBYOPT" => [ENV.fetch("RUBYOPT", nil), "-I#{ROOT}/lib", "-revt/async"].compact.join(" ")}
        [[*ruby, "-rbundler/setup", "bench/falcon_server.rb", app], env, /\A#<Evt::Selector #{backend || "\\w+"}\b/,
         "Evt::Selector#{" on #{backend}" if backend}"]
      when /\Aitsi-(async|evt)\z/
        scheduler = Regexp.last_match(1) == "evt" ? "Evt::Scheduler" : "Async::Scheduler"
        [[*ruby, "-rbundler/setup", "bench/itsi_server.rb", scheduler, app], {"EVT_BACKEND" => nil, "IO_EVENT_SELECTOR" => nil},
         /\A#{scheduler}\z/, scheduler]
      end
    end

    # One server, one app, under wrk's keep-alive load after the warm-up; a GET after each wrk run
    # checks the server still answers. A failure carries the start of the server's stderr.
    def falcon(subject, app)
      log = File.join(ROOT, "tmp/bench/falcon.#{subject}.#{app}.stderr")
      FileUtils.mkdir_p(File.dirname(log))
      command, env, expected, expected_name = falcon_server(subject, app)
      server = nil
      begin
        server = start_server(command, err: log, env: env)
        runs_on = server[:line][/\((?:selector|scheduler) (.*)\)\s*\z/, 1]
        raise Failure, "it runs on #{runs_on || "an unknown loop"}, not #{expected_name}" unless runs_on&.match?(expected)

        url = "http://127.0.0.1:#{server[:port]}/"
        warmup = wrk(url, @connections, @size[:warmup], [], timeout: FALCON_PROBE)
        answers!(server[:port], "after #{warmup[:requests]} requests in the #{@size[:warmup]} s warm-up")
        before = group_cpu_seconds(server[:pid])
        report = wrk(url, @connections, @size[:duration], [], timeout: FALCON_PROBE)
        used = group_cpu_seconds(server[:pid]) - before
        answers!(server[:port], "after #{report[:requests]} requests in the #{@size[:duration]} s run")
        {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2), p99_ms: report[:p99_ms],
         errors: report[:errors], connections: @connections, loop: short_loop(runs_on)}
      rescue Failure, Timeout::Error, SystemCallError => e
        reason = (soak_death(server, log) if ended?(server)) || e.message.lines.first.strip
        first = stderr_lines(log).find { |l| l =~ /Error|error|abort|\[BUG\]/ }
        reason += " (stderr: #{first.strip})" if first && !reason.include?(first.strip)
        raise Failure.new(reason, stderr: stderr_lines(log).first(20), stderr_file: relative(log))
      ensure
        stop(server)
      end
    end

    # Whether the server's process has ended (a zombie or gone): only then is there a death to report.
    def ended?(server)
      return false unless server

      File.read("/proc/#{server[:pid]}/stat").split(") ").last.split.first == "Z"
    rescue SystemCallError
      true
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
      p99 = out[/^\s+99%\s+([\d.]+)(us|ms|s)\b/] && Regexp.last_match(1).to_f * {"us" => 0.001, "ms" => 1, "s" => 1000}.fetch(Regexp.last_match(2))
      {requests: requests, rps: out[%r{Requests/sec:\s+([\d.]+)}, 1].to_f, p99_ms: p99&.round(2), errors: errors}
    end

    # Calls per request, from strace -c attached to every thread of the warm server for a short
    # separate load: it slows the server down, so no other figure comes from this run.
    def syscalls_per_request(pid, url, connections, headers)
      tasks = Dir.children("/proc/#{pid}/task").flat_map { |tid| ["-p", tid] }
      log = File.join(ROOT, "tmp/bench/strace.#{pid}")
      strace = Process.spawn("strace", "-c", "-f", "-qq", "-o", log, *tasks, err: File::NULL)
      sleep 0.3 # attached
      report = wrk(url, connections, @size[:strace], headers)
      Process.kill(:INT, strace)
      Process.wait(strace)
      total = File.readlines(log).grep(/\btotal$/).first
      File.delete(log)
      total ? (total.split[3].to_f / report[:requests]).round(2) : nil
    rescue Failure, SystemCallError
      nil
    end

    # ---- the other scenarios -----------------------------------------------------------------

    # A scenario script, pinned to CPU 0 unless it is about using every core; one that has not ended
    # within +limit+ seconds is killed (its process group with it) and fails its row.
    def script(name, subject, *arguments, pinned: true, limit: 600)
      command = [*(pinned ? pin(0) : []), *ruby_for(subject), "bench/#{name}", subject, *arguments.map(&:to_s)]
      out, err, status = Open3.popen3(bench_env, *command, chdir: ROOT, pgroup: true) do |stdin, stdout, stderr, waiter|
        stdin.close
        readers = [stdout, stderr].map { |io| Thread.new { io.read } }
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

    # blocking-ops: the run with the median time of @size[:repeats], each in a fresh process, and
    # every run's seconds (one run on this shared machine moves by 10% either way).
    def blocking_ops(subject)
      runs = Array.new(@size[:repeats]) do
        script("blocking_ops.rb", subject, @size[:deflates], @size[:deflate_mib], pinned: false)
      end
      runs.sort_by { |run| run[:seconds] }[runs.size / 2].merge(runs: runs.map { |run| run[:seconds] })
    end

    def timers(subject)
      fibers = @size[:fibers]
      ensure_map_count(fibers)
      script("timers.rb", subject, fibers).merge(fibers: fibers)
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

    def idle(subject)
      count = @size[:idle]
      log = File.join(ROOT, "tmp/bench/idle.#{subject}.stderr")
      FileUtils.mkdir_p(File.dirname(log))
      server = start_server([*ruby_for(subject), "bench/idle_server.rb", subject, count.to_s], err: log)
      client = IO.popen([*ruby, "bench/idle_client.rb", server[:port].to_s, count.to_s], "r+", chdir: ROOT, err: File::NULL)
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

    # ---- soak ----------------------------------------------------------------------------------

    # Every backend of the C extension that runs here (the pure-Ruby select loop is not this code).
    def soak_subjects
      script = 'require "evt"; puts Evt::Loop.backends.select { |b| Evt::Loop.probe(b).nil? } if Evt.extension?'
      out, status = Open3.capture2(*ruby, "-e", script)
      abort "bin/bench: evt does not load" unless status.success?
      names = out.split.map { |name| "evt-#{name}" }
      return [["evt", "the C extension is not loaded, and the soak is about its backends"]] if names.empty?

      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      names.map { |name| [name, nil] }
    end

    # bench/soak.rb under both wrk loads, a row at the end of every interval: the server's counters,
    # then its RSS, descriptors and CPU time from /proc. A server that dies or stops answering ends
    # the backend's soak with the reason and the start of its stderr; the rows so far stay.
    def soak(subject)
      seconds = @size[:soak]
      interval = seconds >= 120 ? 60 : 5
      log = File.join(ROOT, "tmp/bench/soak.#{subject}.stderr")
      FileUtils.mkdir_p(File.dirname(log))
      figures = {duration_s: seconds, interval_s: interval, intervals: [], stderr_file: relative(log)}
      started = clock
      note "  #{subject}: #{seconds} s, a row every #{interval} s (the server's stderr: #{relative(log)})"
      note soak_header
      server = nil
      begin
        server = start_server([*ruby, "bench/soak.rb", subject], mode: "r+", err: log)
        soak_rows(server, seconds, interval, figures)
      rescue Failure, Timeout::Error, SystemCallError, JSON::ParserError => e
        figures[:error] = soak_death(server, log) || e.message.lines.first.strip
        figures[:stderr] = stderr_lines(log).first(20)
      ensure
        stop(server)
      end
      figures.merge!(soak_verdict(figures))
      note format("  %s: %.0f s, %s", subject, clock - started, figures[:pass] ? "PASS" : "FAIL")
      figures
    end

    def soak_rows(server, seconds, interval, figures)
      url = "http://127.0.0.1:#{server[:port]}/"
      # The first row counts from the server's start: an error before this sample is one too.
      previous = soak_sample(server).merge(counters: {})
      elapsed = 0
      while elapsed < seconds
        slice = [interval, seconds - elapsed].min
        loads = soak_load(url, slice)
        current = soak_sample(server)
        elapsed += slice
        figures[:intervals] << soak_row(elapsed, previous, current, loads)
        figures[:samples] = current[:counters][:samples]
        note soak_line(figures[:intervals].last)
        previous = current
      end
    end

    # Every wrk load at once, for +seconds+, all on CPU 1.
    def soak_load(url, seconds)
      threads = SOAK_LOAD.map do |connections, headers|
        Thread.new { wrk(url, connections, seconds, headers) }.tap { |t| t.report_on_exception = false }
      end
      outcomes = threads.map do |thread|
        thread.value
      rescue StandardError => e
        e
      end
      failed = outcomes.find { |outcome| outcome.is_a?(Exception) }
      raise failed if failed

      outcomes
    end

    # The server's counters (it parks its pipe-making fibers and waits for the HTTP connections to
    # end first), then /proc, then the server goes on.
    def soak_sample(server)
      io = server[:stdout]
      reply = Timeout.timeout(SOAK_ANSWER) do
        io.puts "sample"
        io.flush
        io.gets
      end
      raise Failure, "the server closed its output" unless reply

      counters = JSON.parse(reply, symbolize_names: true)
      raise Failure, "the server's sampler failed: #{counters[:fatal]}" if counters[:fatal]

      pid = server[:pid]
      sample = {counters: counters, rss_mb: proc_rss_mb(pid), fds: Dir.children("/proc/#{pid}/fd").size,
                cpu: cpu_seconds(pid), at: clock}
      io.puts "resume"
      io.flush
      sample
    rescue Timeout::Error
      raise Failure, "the server did not answer a sample in #{SOAK_ANSWER} s (its loop hung?)"
    end

    def soak_row(at, before, after, loads)
      count = ->(key) { after[:counters][key].to_i - before[:counters][key].to_i }
      progress = {requests: count.call(:requests), pipes: count.call(:pipes), sleeps: count.call(:sleeps),
                  timeouts: count.call(:timeouts_done) + count.call(:timeouts_fired), queued: count.call(:queued),
                  closes: count.call(:closes)}
      stalled = SOAK_ACTIVITIES.filter_map { |key, name| name unless progress[key].positive? }
      wrk_errors = loads.sum { |load| load[:errors] }
      server_errors = count.call(:errors)
      {t_s: at, **progress, errors: wrk_errors + server_errors + stalled.size, wrk_errors: wrk_errors,
       server_errors: server_errors, stalled: stalled, wrk_requests: loads.sum { |load| load[:requests] },
       timeouts_fired: count.call(:timeouts_fired), woken: count.call(:woken), late_ms: after[:counters][:late_ms],
       p99_ms: loads.map { |load| load[:p99_ms] }, rss_mb: after[:rss_mb].round(1), fds: after[:fds],
       cpu_pct: ((after[:cpu] - before[:cpu]) * 100 / (after[:at] - before[:at])).round(1)}
    end

    def soak_header
      SOAK_COLUMNS.map { |_, title, width, _| title.rjust(width) }.join(" ")
    end

    def soak_line(row)
      SOAK_COLUMNS.map { |key, _, width, fmt| format(fmt, row[key]).rjust(width) }.join(" ")
    end

    # Why the server is gone, with the first line of its stderr that says what went wrong; nil
    # while it runs.
    def soak_death(server, log)
      return nil unless server

      status = nil
      20.times do # it may still be writing its crash report
        break if (status = Process.waitpid2(server[:pid], Process::WNOHANG)&.last)

        sleep 0.1
      end
      return nil unless status

      how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
      lines = stderr_lines(log)
      first = lines.find { |l| l =~ /\[BUG\]|Error|error|abort/ } || lines.first
      "the server died (#{how})#{": #{first.strip}" if first}"
    end

    def stderr_lines(log)
      File.exist?(log) ? File.readlines(log, chomp: true) : []
    end

    # The targets: no error, RSS at the last row within SOAK_RSS_PERCENT of the first, and the very
    # same descriptor count at every row (taken at a point where the server holds the same ones).
    def soak_verdict(figures)
      rows = figures[:intervals]
      return {pass: false, verdict: "FAIL: #{figures[:error] || "fewer than two rows"}"} if rows.size < 2

      first, last = rows.values_at(0, -1)
      errors = rows.sum { |row| row[:errors] }
      rss_percent = ((last[:rss_mb] / first[:rss_mb] - 1) * 100).round(1)
      fds = rows.map { |row| row[:fds] }
      failed = []
      failed << figures[:error] if figures[:error]
      failed << "errors" unless errors.zero?
      failed << "RSS" if rss_percent.abs > SOAK_RSS_PERCENT
      failed << "descriptors" unless fds.uniq.size == 1
      text = format("%d errors (target 0); RSS %.1f MB at %d s, %.1f MB at %d s: %+.1f %% (target: within %.0f %%); ",
                    errors, first[:rss_mb], first[:t_s], last[:rss_mb], last[:t_s], rss_percent, SOAK_RSS_PERCENT)
      text += fds.uniq.size == 1 ? "descriptors #{fds.first} at every row (flat)" : "descriptors #{fds.join(" ")} (not flat)"
      {errors: errors, rss_change_percent: rss_percent, fds_first: fds.first, fds_last: fds.last, fds_min: fds.min,
       fds_max: fds.max, fds_flat: fds.uniq.size == 1, pass: failed.empty?,
       verdict: failed.empty? ? "PASS: #{text}" : "FAIL (#{failed.join(", ")}): #{text}"}
    end

    def print_soak
      rows = @results.select { |r| r[:scenario] == "soak" }
      puts
      puts "soak (#{description("soak")})"
      puts "targets: 0 errors; RSS at the last row within #{SOAK_RSS_PERCENT.to_i} % of the first row's; descriptors flat " \
           "(the same count at every row)"
      rows.each do |row|
        puts
        next puts "#{row[:subject]}  n/a: #{row[:skipped]}" if row[:skipped]

        puts "#{row[:subject]}: #{row[:duration_s]} s, a row every #{row[:interval_s]} s"
        puts soak_header
        row[:intervals].each { |interval| puts soak_line(interval) }
        soak_problems(row).each { |line| puts "  #{line}" }
        puts "verdict #{row[:subject]}: #{row[:verdict]}"
      end
      measured = rows.reject { |r| r[:skipped] }
      if measured.size > 1
        passed, failed = measured.partition { |r| r[:pass] }
        puts
        puts "soak: #{[("PASS on #{passed.map { |r| r[:subject] }.join(", ")}" if passed.any?),
                       ("FAIL on #{failed.map { |r| r[:subject] }.join(", ")}" if failed.any?)].compact.join("; ")}"
      end
      puts NOTES["soak"]
      $stdout.flush
    end

    # What the errors were: the server's samples (the first kinds, with their counts), wrk's, the
    # activities that stalled, and a failure with the start of the server's stderr.
    def soak_problems(row)
      lines = (row[:samples] || {}).map { |text, count| "error x#{count}: #{text}" }
      row[:intervals].each do |interval|
        lines << "at #{interval[:t_s]} s: #{interval[:wrk_errors]} wrk errors (socket or non-2xx)" if interval[:wrk_errors].positive?
        lines << "at #{interval[:t_s]} s: no progress in #{interval[:stalled].join(", ")}" if interval[:stalled].any?
      end
      if row[:error]
        lines << "FAILED: #{row[:error]}"
        lines.concat(row[:stderr].first(8).map { |line| "  stderr: #{line}" }) if row[:stderr]&.any?
        lines << "  (the whole stderr: #{row[:stderr_file]})"
      end
      lines
    end

    # ---- figures -------------------------------------------------------------------------------

    # What each scenario is judged by: lower is better for all of them.
    def metric(scenario)
      METRICS.fetch(scenario)
    end

    def add_ratios(scenario)
      return add_falcon_ratios if scenario == "falcon"
      return add_rails_ratios if scenario == "rails"

      key = metric(scenario)
      rows = @results.select { |r| r[:scenario] == scenario && r[key] }
      c = rows.find { |r| r[:subject] == "c-epoll" }
      # A peer that left readers hanging did not do the job, however fast its close.
      # The core scenarios compare evt one way against evt the other (a peer there is a reference).
      core = CORE_SUBJECTS.key?(scenario)
      best_peer = rows.select { |r| PEERS.include?(r[:subject]) && !r[:hang] }.min_by { |r| r[key] } unless core
      first = rows.first if core
      rows.each do |row|
        if first && row != first
          row[:vs_first] = (row[key] / first[key]).round(2)
          row[:rps_vs_first] = row[:rps].fdiv(first[:rps]).round(2) if row[:rps]
        end
        row[:vs_c] = (row[key] / c[key]).round(2) if c && row != c
        row[:vs_best_peer] = (row[key] / best_peer[key]).round(2) if best_peer
        row[:best_peer] = best_peer[:subject] if best_peer
      end
      add_rps_ratios(rows) if scenario == "http-redis"
    end

    # http-redis is judged by req/s too: each row's over the peer that served the most.
    def add_rps_ratios(rows)
      fastest = rows.select { |r| PEERS.include?(r[:subject]) }.max_by { |r| r[:rps] } or return
      rows.each do |row|
        row[:rps_vs_best_peer] = row[:rps].fdiv(fastest[:rps]).round(2)
        row[:fastest_peer] = fastest[:subject]
      end
    end

    # falcon: each row against the best (least CPU per request) io-event row of the same server and app.
    def add_falcon_ratios
      rows = @results.select { |r| r[:scenario] == "falcon" && r[:cpu_us_per_req] }
      rows.group_by { |r| r[:app] }.each_value do |same_app|
        same_app.each do |row|
          baselines = FALCON_BASELINES.fetch(row[:subject][/\A[a-z]+/])
          best = same_app.select { |r| baselines.include?(r[:subject]) }.min_by { |r| r[:cpu_us_per_req] } or next
          row[:io_event_row] = best[:subject]
          row[:vs_io_event] = (row[:cpu_us_per_req] / best[:cpu_us_per_req]).round(2)
          row[:rps_vs_io_event] = row[:rps].fdiv(best[:rps]).round(2)
        end
      end
    end

    def print_table(scenario)
      return print_falcon if scenario == "falcon"
      return print_rails if scenario == "rails"
      return print_close_waiters if scenario == "close-waiters"
      return print_soak if scenario == "soak"

      rows = @results.select { |r| r[:scenario] == scenario }
      columns = if scenario == "http-cpu"
                  [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                   [:errors, "errors", "%d"], [:rss_mb, "RSS MB", "%.1f"], [:rps_vs_first, "req/s x 1st", "%.2f"]]
                elsif scenario == "blocking-ops"
                  [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"], [:vs_first, "x 1st", "%.2f"],
                   [:runs, "runs (s)", "%s"]]
                elsif scenario == "http-redis"
                  [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                   [:errors, "errors", "%d"], [:rps_vs_best_peer, "req/s x peer", "%.2f"]]
                elsif scenario.start_with?("http-")
                  [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                   [:errors, "errors", "%d"], [:syscalls_per_req, "syscalls/req", "%.2f"], [:vs_c, "x C", "%.2f"]]
                elsif scenario == "write-pieces"
                  [[:split_ms, "write(a,b) ms", "%.3f"], [:joined_ms, "write(a+b) ms", "%.3f"]]
                elsif scenario == "idle-connections"
                  [[:rss_mb, "RSS MB", "%.1f"]]
                else
                  [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"]] +
                    (if scenario == "timers"
                       [[:rss_mb, "peak RSS MB", "%.1f"], [:late_us, "late us", "%.1f"], [:late_p99_us, "late p99 us", "%.1f"],
                        [:idle_cpu_pct, "idle CPU %", "%.2f"]]
                     else []
                     end)
                end
      columns << [:vs_best_peer, "x best peer", "%.2f"] unless CORE_SUBJECTS.key?(scenario)
      puts
      puts "#{scenario} (#{description(scenario)}; lower #{metric(scenario)} is better)"
      puts format("%-13s", "subject") + columns.map { |_, title, _| format(" %13s", title) }.join
      rows.each do |row|
        line = format("%-13s", row[:subject])
        line += if row[:skipped] then "  n/a: #{row[:skipped]}"
                elsif row[:error] then "  FAILED: #{row[:error]}"
                else columns.map { |key, _, fmt| format(" %13s", cell(row[key], fmt)) }.join
                end
        puts line
      end
      best = rows.find { |r| r[:best_peer] }
      puts "best peer: #{best[:best_peer]}" if best
      fastest = rows.find { |r| r[:fastest_peer] }
      puts "peer with the most req/s: #{fastest[:fastest_peer]}" if fastest
      print_repeats(rows, metric(scenario))
      puts NOTES[scenario] if NOTES[scenario]
      $stdout.flush
    end

    # A table per app; a failed row shows the start of its server's stderr.
    def print_falcon
      columns = [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                 [:errors, "errors", "%d"], [:vs_io_event, "x io-event", "%.2f"], [:rps_vs_io_event, "req/s x i-e", "%.2f"],
                 [:loop, "loop", "%s"]]
      titles = FALCON_APPS.to_h { |app, title| [app, "falcon (#{title}) (#{description("falcon")}; lower cpu_us_per_req is better)"] }
      print_app_tables("falcon", titles, columns, NOTES["falcon"])
    end

    # The falcon and rails scenarios: a table per app (+titles+: app => heading), +columns+ as
    # [key, title, format]; a failed row shows the start of its server's stderr.
    def print_app_tables(scenario, titles, columns, note)
      titles.each do |app, heading|
        rows = @results.select { |r| r[:scenario] == scenario && r[:app] == app }
        next if rows.empty?

        puts
        puts heading
        puts format("%-20s", "subject") + columns.map { |_, name, _| format(" %12s", name) }.join
        rows.each do |row|
          line = format("%-20s", row[:subject])
          line += if row[:skipped] then "  n/a: #{row[:skipped]}"
                  elsif row[:error] then "  FAILED: #{row[:error]}"
                  else columns.map { |key, _, fmt| format(" %12s", cell(row[key], fmt)) }.join
                  end
          puts line
          next unless row[:error] && row[:stderr_file]

          row[:stderr].to_a.first(6).each { |l| puts "    stderr: #{l[0, 160]}" }
          puts "    (its stderr: #{row[:stderr_file]})"
        end
        print_repeats(rows, :cpu_us_per_req)
      end
      puts note
      $stdout.flush
    end

    # With --repeat: that the rows are median runs, and every run's figure.
    def print_repeats(rows, key)
      repeated = rows.select { |r| r[:repeat_runs] }
      return if repeated.empty?

      puts "each row is the median of #{repeated.first[:repeat_runs].size} runs by #{key}; every run's #{key}:"
      repeated.each { |r| puts format("  %-17s %s", r[:subject], r[:repeat_runs].map { |v| format("%.4g", v) }.join("  ")) }
    end

    def cell(value, fmt)
      return "-" if value.nil?
      return value.map { |each| format("%.2f", each) }.join(" ") if value.is_a?(Array)

      format(fmt, value)
    end

    def print_close_waiters
      rows = @results.select { |r| r[:scenario] == "close-waiters" }
      sizes = @size[:waiters]
      puts
      puts "close-waiters (#{description("close-waiters")}; lower close_avg_us is better, woken should be N)"
      puts format("%-13s", "subject") + sizes.map { |n| format(" %9s %10s", "us@#{n}", "woken@#{n}") }.join + format(" %13s", "us@max/us@min")
      rows.each do |row|
        line = format("%-13s", row[:subject])
        if row[:skipped] then line += "  n/a: #{row[:skipped]}"
        elsif row[:error] then line += "  FAILED: #{row[:error]}"
        else
          sizes.each do |n|
            point = row[:points].find { |p| p[:n] == n } || {}
            woken = if point[:error] then "FAILED"
                    elsif point[:woken] then "#{point[:woken]}#{" HANG" if point[:hang]}"
                    else "-"
                    end
            line += format(" %9s %10s", point[:close_avg_us] ? format("%.2f", point[:close_avg_us]) : "-", woken)
          end
          line += format(" %13s", row[:flat] ? format("%.2f", row[:flat]) : "-")
        end
        puts line
      end
      puts NOTES["close-waiters"]
      $stdout.flush
    end

    def description(scenario)
      case scenario
      when "http-keepalive" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive; blocking with -c1"
      when "http-close" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, Connection: close"
      when "http-redis" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive, a Redis GET per request, pool of #{@redis_pool}"
      when "pipe-pingpong" then "#{@size[:pairs]} pipe pairs x #{@size[:messages]} x 1 KiB"
      when "big-reads" then "#{@size[:big_clients]} Net::HTTP clients x #{@size[:big_rounds]} bodies of 512 KiB from a server in the same process"
      when "write-pieces" then "#{@size[:rounds]} keep-alive requests from a client without a scheduler; mean round trip"
      when "timers" then "#{@size[:fibers]} fibers sleeping 0-100 ms; then one fiber sleeping 1, 2, 5 ms x 100"
      when "idle-connections" then "#{@size[:idle]} idle connections, a reader waiting on each"
      when "close-waiters" then "N = #{@size[:waiters].join(", ")} readers blocked on N pipes, every read end closed"
      when "blocking-ops" then "#{@size[:deflates]} fibers each deflating #{@size[:deflate_mib]} MiB with Zlib"
      when "http-cpu" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive, 0.5 ms of Ruby per request"
      when "falcon" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s --timeout #{FALCON_PROBE}s, keep-alive"
      when "rails" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s --timeout #{RailsScenario::TIMEOUT}s, keep-alive"
      when "soak"
        "#{@size[:soak]} s of mixed load on one server per C backend, one backend at a time: " \
          "#{SOAK_LOAD.map { |c, headers| "wrk -t1 -c#{c} #{headers.empty? ? "keep-alive" : "Connection: close"}" }.join(" and ")} " \
          "at once; #{Soak::PINGPONG_PAIRS} pipe pairs ping-ponging checked messages; #{Soak::SLEEPERS} fibers sleeping " \
          "0-10 ms; #{Soak::TIMEOUT_FIBERS} fibers in Timeout.timeout(2-10 ms) around sleeps, Queue#pop and pipe reads; " \
          "#{Soak::PRODUCERS} threads feeding #{Soak::PRODUCERS * Soak::QUEUES_PER_PRODUCER} queues that fibers pop; " \
          "pipes fibers read or write closed by a fiber (#{Soak::FIBER_CLOSE_SLOTS} at a time) or a thread " \
          "(#{Soak::THREAD_CLOSE_SLOTS})"
      end
    end

    # The JSON holds every scenario; the chart every one but soak, whose rows over time are no bar.
    # A run with nothing to chart leaves the chart file as it was. Returns the files written.
    def write_outputs
      document = {ruby: RUBY_VERSION, yjit: @options[:yjit], cores: @cores, date: Time.now.utc.strftime("%Y-%m-%d"),
                  run: @options[:quick] ? "quick" : "full", http_duration_s: @size[:duration],
                  connections: @connections, descriptor_limit: @descriptors.slice(:before, :after), results: @results}
      document[:soak_duration_s] = @size[:soak] if @options[:only].include?("soak")
      [@options[:json], @options[:svg]].each { |f| Dir.mkdir(File.dirname(f)) unless Dir.exist?(File.dirname(f)) }
      File.write(@options[:json], "#{JSON.pretty_generate(document)}\n")
      charted = @results.reject { |r| r[:scenario] == "soak" }
      return [@options[:json]] if charted.empty?

      File.write(@options[:svg], Chart.new(document.merge(results: charted)).to_svg)
      [@options[:json], @options[:svg]]
    end

    # ---- helpers -------------------------------------------------------------------------------

    def ruby
      [RbConfig.ruby, *("--yjit" if @options[:yjit]), "-I#{ROOT}/lib"]
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

    # async's gems come from the Gemfile's optional :bench group; everything else needs only lib/.
    def ruby_for(subject)
      subject.start_with?("async-") || %w[carbon uringmachine].include?(subject) ? [*ruby, "-rbundler/setup"] : ruby
    end

    # The line of a failed process's stderr that says what went wrong.
    def first_error(err, status)
      line = err.lines.find { |l| l =~ /Error|error|abort/ } || err.lines.last
      (line || "exited with status #{status.exitstatus}").strip
    end

    def bench_env
      {"BUNDLE_WITH" => "bench", "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile")}
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

    def cpu_seconds(pid)
      fields = File.read("/proc/#{pid}/stat").split(") ").last.split
      (Integer(fields[11]) + Integer(fields[12])).fdiv(HZ)
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

Bench::Run.new(ARGV).call if $PROGRAM_NAME == __FILE__
