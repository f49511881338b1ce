# frozen_string_literal: true

# bin/bench's driver: every scenario against every subject, each subject a fresh process, figures
# comparable within one run. See bin/bench --help.
require "etc"
require "json"
require "open3"
require "optparse"
require "rbconfig"
require "timeout"
require_relative "chart"

module Bench
  ROOT = File.expand_path("..", __dir__)
  SCENARIOS = %w[http-keepalive http-close pipe-pingpong timers idle-connections close-waiters blocking-ops
                 http-cpu].freeze
  # Scenarios about evt's use of every core, with subjects of their own (evt configured two ways).
  CORE_SUBJECTS = {"blocking-ops" => ->(_cores) { %w[evt-pool-off evt-pool-on threads] },
                   "http-cpu" => ->(cores) { ["evt-workers-1", "evt-workers-#{cores}"] }}.freeze
  PEERS = %w[blocking threads async-epoll async-uring].freeze
  HZ = Etc.sysconf(Etc::SC_CLK_TCK)

  # Sizes: the full run, and --quick (the whole suite in under a minute).
  SIZES = {
    full: {duration: 5, warmup: 1, strace: 2, pairs: 50, messages: 10_000, fibers: 100_000, idle: 10_000,
           waiters: [10, 100, 1000, 8000], deflates: 16, deflate_mib: 8, repeats: 3},
    quick: {duration: 1, warmup: 1, strace: 1, pairs: 10, messages: 2_000, fibers: 10_000, idle: 1_000,
            waiters: [10, 100, 1000], deflates: 4, deflate_mib: 2, repeats: 1},
  }.freeze

  NOTES = {
    "timers" => "(peak RSS counts the fibers alive at once: a scheduler that starts them faster has more " \
                "of them overlapping within the 100 ms)",
    "http-keepalive" => "(syscalls/req: a separate 1-2 s run under strace -c -f, which slows the server down)",
    "close-waiters" => "(us: IO#close's average time per IO; woken: readers the closes themselves ended with " \
                       "IOError, of N; HANG: the rest never woke)",
    "blocking-ops" => "(Ruby 3.4 hands each deflate to blocking_operation_wait: pool-on runs them on a thread per core; " \
                      "threads: one Ruby thread per deflate, no scheduler, for reference; a full run runs each " \
                      "subject 3 times, in fresh processes, and shows the median run)",
    "http-cpu" => "(Evt::Workers processes, not pinned: they may use every core; wrk pinned to CPU 1; " \
                  "CPU us/req counts every worker)",
  }.freeze

  class Failure < StandardError; end

  # One benchmark run: options in, tables on stdout, JSON and SVG out.
  class Run
    def initialize(argv)
      @options = {quick: false, json: File.join(ROOT, "bench/results/latest.json"),
                  svg: File.join(ROOT, "bench/results/latest.svg"), only: SCENARIOS, subjects: nil, duration: nil}
      begin
        parse(argv)
      rescue OptionParser::ParseError => e
        abort "bin/bench: #{e.message} (bin/bench --help)"
      end
      @size = SIZES.fetch(@options[:quick] ? :quick : :full).dup
      @size[:duration] = @options[:duration] if @options[:duration]
      @cores = Etc.nprocessors
      @results = []
      @started = clock
    end

    def call
      subjects = available_subjects
      note "evt bench: Ruby #{RUBY_VERSION}, #{@cores} cores, #{@options[:quick] ? "quick" : "full"} run"
      note "server pinned to CPU 0 and load to CPU 1" if @cores >= 2
      @options[:only].each do |scenario|
        note ""
        note "== #{scenario}"
        subjects_for(scenario, subjects).each do |subject, unavailable|
          @results << measure(scenario, subject, unavailable)
        end
        add_ratios(scenario)
        print_table(scenario)
      end
      write_outputs
      note format("\ndone in %.0f s: %s, %s", clock - @started, relative(@options[:json]), relative(@options[:svg]))
    end

    private

    def parse(argv)
      OptionParser.new do |o|
        o.banner = "usage: bin/bench [options]"
        o.on("--quick", "the whole suite in under a minute, smaller sizes") { @options[:quick] = true }
        o.on("--json FILE", "write the results here (bench/results/latest.json)") { |f| @options[:json] = File.expand_path(f) }
        o.on("--svg FILE", "write the chart here (bench/results/latest.svg)") { |f| @options[:svg] = File.expand_path(f) }
        o.on("--only SCENARIO[,..]", Array, "scenarios: #{SCENARIOS.join(", ")}") do |list|
          unknown = list - SCENARIOS
          raise OptionParser::InvalidArgument, "unknown scenario #{unknown.join(", ")}" unless unknown.empty?

          @options[:only] = list
        end
        o.on("--subjects NAME[,..]", Array, "subjects to run (default: all)") { |list| @options[:subjects] = list }
        o.on("--duration S", Integer, "whole seconds each HTTP measurement lasts") do |s|
          raise OptionParser::InvalidArgument, "duration must be positive" unless s.positive?

          @options[:duration] = s
        end
      end.parse!(argv)
    end

    # [[name, nil or why it cannot run]], in table order.
    def available_subjects
      subjects = [["c-epoll", c_server_problem], ["blocking", nil], ["threads", nil]]
      subjects += evt_backends.map { |name| ["evt-#{name}", nil] }
      async = async_problems
      subjects += %w[async-epoll async-uring].map { |name| [name, async[name]] }
      if @options[:subjects]
        unknown = @options[:subjects] - subjects.map(&:first) - CORE_SUBJECTS.values.flat_map { |names| names.call(@cores) }
        abort "bin/bench: unknown subject #{unknown.join(", ")}; subjects: #{subjects.map(&:first).join(", ")}" if unknown.any?
        subjects.select! { |name, _| @options[:subjects].include?(name) }
      end
      subjects
    end

    # The core scenarios' own subjects (those --subjects names, if it names any of them).
    def subjects_for(scenario, subjects)
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

    def measure(scenario, subject, unavailable)
      row = {scenario: scenario, subject: subject}
      return row.merge(skipped: unavailable) if unavailable

      reason = not_applicable(scenario, subject)
      return row.merge(skipped: reason) if reason

      progress(subject) do
        figures = case scenario
                  when "http-keepalive" then http(subject, keepalive: true)
                  when "http-close" then http(subject, keepalive: false)
                  when "pipe-pingpong" then script("pipe_pingpong.rb", subject, @size[:pairs], @size[:messages])
                  when "timers" then timers(subject)
                  when "idle-connections" then idle(subject)
                  when "close-waiters" then close_waiters(subject)
                  when "blocking-ops" then blocking_ops(subject)
                  when "http-cpu" then http_cpu(subject)
                  end
        row.merge(figures)
      end
    rescue Failure, Timeout::Error, SystemCallError => e
      row.merge(error: e.message.lines.first.strip)
    end

    def not_applicable(scenario, subject)
      return nil if scenario.start_with?("http-") || CORE_SUBJECTS.key?(scenario)
      return "an HTTP server only" if subject == "c-epoll"
      return "one thread cannot block on several readers" if scenario == "close-waiters" && subject == "blocking"
      return "one thread cannot hold #{@size[:idle]} waiting connections" if scenario == "idle-connections" && subject == "blocking"
      return "#{@size[:fibers]} sleepers need fibers or as many threads" if scenario == "timers" && %w[blocking threads].include?(subject)

      nil
    end

    # ---- HTTP ----------------------------------------------------------------------------------

    def http(subject, keepalive:)
      # One connection at a time cannot keep 100 keep-alive connections: the rest would starve.
      connections = subject == "blocking" && keepalive ? 1 : 100
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

    # http-cpu: evt-workers-N, under the same load; the CPU time of every worker counts.
    def http_cpu(subject)
      workers = Integer(subject[/\d+\z/])
      server = start_server([*ruby, "bench/http_cpu_server.rb", workers.to_s], pinned: false)
      begin
        url = "http://127.0.0.1:#{server[:port]}/"
        wrk(url, 100, @size[:warmup], [])
        before = group_cpu_seconds(server[:pid])
        report = wrk(url, 100, @size[:duration], [])
        used = group_cpu_seconds(server[:pid]) - before
        {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2), p99_ms: report[:p99_ms],
         errors: report[:errors], workers: workers}
      ensure
        stop(server)
      end
    end

    # A server in a process group of its own, pinned to CPU 0 unless told otherwise; it prints
    # "listening on PORT".
    def start_server(command, pinned: true)
      stdout = IO.popen(bench_env, [*(pinned ? pin(0) : []), *command], chdir: ROOT, err: File::NULL, pgroup: true)
      server = {pid: stdout.pid, stdout: stdout}
      line = Timeout.timeout(30) { stdout.gets }
      server[:port] = line && line[/listening on (\d+)/, 1] or raise Failure, "the server did not start"
      server
    rescue StandardError
      stop(server)
      raise
    end

    def stop(server)
      return unless server

      begin
        Process.kill(:KILL, -server[:pid])
      rescue Errno::ESRCH
        nil
      end
      server[:stdout].close
    end

    def wrk(url, connections, seconds, headers)
      out, status = Open3.capture2e(*pin(1), "wrk", "-t1", "-c#{connections}", "-d#{seconds}s", "--latency",
                                    "--timeout", "5s", *headers, url)
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

    # A scenario script, pinned to CPU 0 unless it is about using every core.
    def script(name, subject, *arguments, pinned: true)
      out, err, status = Timeout.timeout(600) do
        Open3.capture3(bench_env, *(pinned ? pin(0) : []), *ruby_for(subject), "bench/#{name}", subject, *arguments.map(&:to_s),
                       chdir: ROOT)
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
      server = start_server([*ruby_for(subject), "bench/idle_server.rb", subject, count.to_s])
      client = IO.popen([*ruby, "bench/idle_client.rb", server[:port].to_s, count.to_s], "r+", chdir: ROOT, err: File::NULL)
      begin
        line = Timeout.timeout(120) { server[:stdout].gets }
        raise Failure, "the server did not report" unless line&.start_with?("{")

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
        script("close_waiters.rb", subject, n)
      rescue Failure, Timeout::Error => e
        {n: n, error: e.message.lines.first.strip}
      end
      measured = points.select { |p| p[:close_avg_us] }
      raise Failure, points.first[:error] if measured.empty?

      last = measured.last
      {points: points, n: last[:n], close_avg_us: last[:close_avg_us], woken: last[:woken], hang: points.any? { |p| p[:hang] },
       flat: measured.size > 1 ? (last[:close_avg_us] / measured.first[:close_avg_us]).round(2) : nil}
    end

    # ---- figures -------------------------------------------------------------------------------

    # What each scenario is judged by: lower is better for all of them.
    def metric(scenario)
      {"http-keepalive" => :cpu_us_per_req, "http-close" => :cpu_us_per_req, "pipe-pingpong" => :seconds,
       "timers" => :seconds, "idle-connections" => :rss_mb, "close-waiters" => :close_avg_us,
       "blocking-ops" => :seconds, "http-cpu" => :cpu_us_per_req}.fetch(scenario)
    end

    def add_ratios(scenario)
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
    end

    def print_table(scenario)
      return print_close_waiters if scenario == "close-waiters"

      rows = @results.select { |r| r[:scenario] == scenario }
      columns = if scenario == "http-cpu"
                  [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                   [:errors, "errors", "%d"], [:rps_vs_first, "req/s x 1st", "%.2f"]]
                elsif scenario == "blocking-ops"
                  [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"], [:vs_first, "x 1st", "%.2f"],
                   [:runs, "runs (s)", "%s"]]
                elsif scenario.start_with?("http-")
                  [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                   [:errors, "errors", "%d"], [:syscalls_per_req, "syscalls/req", "%.2f"], [:vs_c, "x C", "%.2f"]]
                elsif scenario == "idle-connections"
                  [[:rss_mb, "RSS MB", "%.1f"]]
                else
                  [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"]] +
                    (scenario == "timers" ? [[:rss_mb, "peak RSS MB", "%.1f"]] : [])
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
      puts NOTES[scenario] if NOTES[scenario]
      $stdout.flush
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
      when "http-keepalive" then "wrk -t1 -c100 -d#{@size[:duration]}s, keep-alive; blocking with -c1"
      when "http-close" then "wrk -t1 -c100 -d#{@size[:duration]}s, Connection: close"
      when "pipe-pingpong" then "#{@size[:pairs]} pipe pairs x #{@size[:messages]} x 1 KiB"
      when "timers" then "#{@size[:fibers]} fibers sleeping 0-100 ms"
      when "idle-connections" then "#{@size[:idle]} idle connections, a reader waiting on each"
      when "close-waiters" then "N = #{@size[:waiters].join(", ")} readers blocked on N pipes, every read end closed"
      when "blocking-ops" then "#{@size[:deflates]} fibers each deflating #{@size[:deflate_mib]} MiB with Zlib"
      when "http-cpu" then "wrk -t1 -c100 -d#{@size[:duration]}s, keep-alive, 0.5 ms of Ruby per request"
      end
    end

    def write_outputs
      document = {ruby: RUBY_VERSION, cores: @cores, date: Time.now.utc.strftime("%Y-%m-%d"),
                  run: @options[:quick] ? "quick" : "full", http_duration_s: @size[:duration],
                  results: @results}
      [@options[:json], @options[:svg]].each { |f| Dir.mkdir(File.dirname(f)) unless Dir.exist?(File.dirname(f)) }
      File.write(@options[:json], "#{JSON.pretty_generate(document)}\n")
      File.write(@options[:svg], Chart.new(document).to_svg)
    end

    # ---- helpers -------------------------------------------------------------------------------

    def ruby
      [RbConfig.ruby, "-I#{ROOT}/lib"]
    end

    # async's gems come from the Gemfile's optional :bench group; everything else needs only lib/.
    def ruby_for(subject)
      subject.start_with?("async-") ? [*ruby, "-rbundler/setup"] : ruby
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
