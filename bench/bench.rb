# frozen_string_literal: true

# bin/bench's driver: every scenario against every subject, each subject a fresh process, figures
# comparable within one run. See bin/bench --help. What runs the processes is bench/driver/runner.rb,
# the tools they are measured with bench/driver/tools.rb, the tables and files bench/driver/report.rb;
# each scenario's own code is in bench/scenarios/ (the scripts and servers they run: bench/*.rb).
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
require_relative "tools/chart"
require_relative "servers/soak_server"
require_relative "subject"

module Bench
  # What each scenario declares in its file (bench/scenarios/), by name: its figure (lower is better:
  # what --repeat takes the median run by, and the ratios use) and the note under its table.
  METRICS = {}
  NOTES = {}

  def self.scenario(name, metric: nil, note: nil)
    METRICS[name] = metric if metric
    NOTES[name] = note if note
  end
end

require_relative "driver/runner"
require_relative "driver/tools"
require_relative "driver/wrk_schedule"
require_relative "driver/report"
require_relative "driver/record"
require_relative "driver/markdown"
require_relative "scenarios/http"
require_relative "scenarios/processes"
require_relative "scenarios/falcon"
require_relative "scenarios/soak"
require_relative "scenarios/insight"
require_relative "scenarios/rails"

module Bench
  ROOT = File.expand_path("..", __dir__)
  SCENARIOS = %w[http-keepalive http-close http-redis pipe-pingpong big-reads thread-server thread-clients write-pieces
                 timers sleep-fanout fiber-memory idle-connections close-waiters blocking-ops http-cpu falcon rails].freeze
  # Scenarios that run only when --only names them: soak takes 10 minutes per backend, insight-cost
  # measures evt against itself.
  ON_REQUEST = %w[soak insight-cost].freeze
  (SCENARIOS - METRICS.keys).then { |none| raise "bench: no metric declared for #{none.join(", ")}" unless none.empty? }
  (SCENARIOS - Chart::METRICS.keys).then { |none| raise "bench: no chart panel for #{none.join(", ")}" unless none.empty? }
  # Scenarios about evt's use of every core, with subjects of their own (evt configured two ways).
  CORE_SUBJECTS = {"blocking-ops" => ->(_cores) { %w[evt-pool-off evt-pool-on threads] },
                   "http-cpu" => ->(cores) { ["evt-workers-1", "evt-workers-#{cores}", "evt-ractors-1", "evt-ractors-#{cores}"] }}.freeze
  PEERS = %w[blocking threads async-epoll async-uring carbon uringmachine].freeze
  # The C references (bench/reference/<file>.c), the limit each HTTP row compares against: the best
  # of them that ran the row ("x C"). subject => [source file, libraries].
  C_SERVERS = {"c-epoll" => ["c_epoll_server", []], "c-uring" => ["c_uring_server", ["-luring"]],
               "c-blocking" => ["c_blocking_server", []]}.freeze

  # The limit of a row: of +rows+ (results of one scenario), the C reference with the lowest +key+
  # that served without an error; nil when none did.
  def self.best_c(rows, key)
    rows.select { |r| C_SERVERS.key?(r[:subject]) && r[key].is_a?(Numeric) && r[:errors].to_i.zero? }.min_by { |r| r[key] }
  end
  # wrk's connections in the HTTP scenarios, unless --connections says otherwise.
  CONNECTIONS = 100
  # Descriptors a process needs besides one per connection (its own files, the pool, wrk's threads).
  SPARE_DESCRIPTORS = 1024
  HZ = Etc.sysconf(Etc::SC_CLK_TCK)
  # Sizes: the full run, and --quick (the whole suite in a few minutes).
  SIZES = {
    full: {duration: 5, warmup: 1, strace: 2, pairs: 50, messages: 10_000, fibers: 100_000, idle: 10_000,
           waiters: [10, 100, 1000, 8000], deflates: 16, deflate_mib: 8, repeats: 3, soak: 600, rounds: 50,
           big_clients: 20, big_rounds: 20, beside_clients: 10, beside_rounds: 200, sleep_scale: 5,
           insight_rounds: INSIGHT_ROUNDS[:full]},
    quick: {duration: 1, warmup: 1, strace: 1, pairs: 10, messages: 2_000, fibers: 10_000, idle: 1_000,
            waiters: [10, 100, 1000], deflates: 4, deflate_mib: 2, repeats: 1, soak: 30, rounds: 20,
            big_clients: 5, big_rounds: 5, beside_clients: 5, beside_rounds: 5, sleep_scale: 1,
            insight_rounds: INSIGHT_ROUNDS[:quick]},
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
    include Runner
    include Tools
    include Report
    include Record
    include HttpScenarios
    include ProcessScenarios
    include FalconScenario
    include SoakScenario
    include InsightScenario
    include RailsScenario

    def initialize(argv)
      @options = {quick: false, json: File.join(ROOT, "bench/results/latest.json"),
                  svg: File.join(ROOT, "bench/results/latest.svg"), only: SCENARIOS, subjects: nil, duration: nil, repeat: 1, yjit: false}
      @argv = argv.dup
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
      @started_at = Time.now.utc
      @git = git_state
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
        add_ratios(scenario) unless ON_REQUEST.include?(scenario)
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
        o.on("--report FILE", "write the Markdown report here (beside the JSON: bench/results/latest.md);",
             "ruby bench/tools/report.rb FILE.json makes one from any results file") { |f| @options[:report] = File.expand_path(f) }
        o.on("--only SCENARIO[,..]", Array, "scenarios: #{SCENARIOS.join(", ")} (all of them by default);",
             "falcon: Falcon and Itsi serving a Rack app (hello; sleep 1 ms) on io-event's selectors and evt's;",
             "rails: a Rails app (a 50 ms query; an instant answer) under Puma, and Falcon on io-event's and evt's;",
             "soak runs only when named here: mixed load for 10 minutes on each C backend (30 s with --quick);",
             "so does insight-cost: what stall reports and a stats reader cost per request, in pairs") do |list|
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
             "a row every 60 s from 3 minutes, else every 5 s") do |s|
          raise OptionParser::InvalidArgument, "soak needs at least 15 s (a warm-up row and two to compare)" unless s >= 15

          @options[:soak] = s
        end
        o.on("--soak-rate R", Integer, "soak paced: its HTTP requests start on a fixed schedule, R a second in all",
             "(its req/s is then the rate asked, not what the CPU the machine gave allowed), and its other",
             "activities rest between rounds, so the server has CPU to spare (unpaced: all as fast as it serves)") do |r|
          raise OptionParser::InvalidArgument, "the rate must be positive" unless r.positive?

          @options[:soak_rate] = r
        end
      end.parse!(argv)
    end

    # [[name, nil or why it cannot run]], in table order.
    def available_subjects
      subjects = C_SERVERS.keys.map { |name| [name, c_server_problem(name)] }
      subjects += [["blocking", nil], ["fibers", nil], ["threads", nil]]
      backends = evt_backends
      subjects += backends.map { |name| ["evt-#{name}", nil] }
      # evt with what a team leaves on in production (Bench::Subject::INSIGHT): by name only.
      insight = backends.product(Subject::INSIGHT.keys).map { |name, kind| "evt-#{name}-#{kind}" }
      subjects += (insight & (@options[:subjects] || [])).map { |name| [name, nil] }
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
      subjects.each do |name, _|
        emulation = @emulated[name] or next
        note "bin/bench: #{name} runs on #{emulation}: an emulation, not a figure of the kernel's own mechanism"
      end
      subjects
    end

    # The core scenarios' own subjects (those --subjects names, if it names any of them).
    def subjects_for(scenario, subjects)
      return soak_subjects if scenario == "soak"
      return insight_subjects if scenario == "insight-cost"
      return falcon_subjects if scenario == "falcon"
      return rails_subjects if scenario == "rails"

      own = CORE_SUBJECTS[scenario] or return subjects
      names = own.call(@cores)
      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      names.map { |name| [name, nil] }
    end

    # The backends evt can run on here; those emulated (kqueue through libkqueue on Linux) are
    # remembered in @emulated, subject => what stands in for the kernel's mechanism.
    def evt_backends
      out, status = Open3.capture2(*ruby, "-e", 'require "evt"; Evt::Scheduler.availables.each { |b| puts [b, Evt::Loop.emulation(b)].compact.join("\t") }')
      abort "bin/bench: evt does not load" unless status.success?
      rows = out.lines.map { |line| line.chomp.split("\t", 2) }
      @emulated = rows.select { |_, emulation| emulation }.to_h { |name, emulation| ["evt-#{name}", emulation] }
      @default_backend = rows.first&.first # availables' first: what Evt::Scheduler.new takes
      rows.map(&:first)
    end

    # Builds the C reference `name` into tmp/bench (@c_servers[name]): nil, or why it cannot run.
    def c_server_problem(name)
      file, libraries = C_SERVERS.fetch(name)
      binary = (@c_servers ||= {})[name] = File.join(ROOT, "tmp/bench", file)
      source = File.join(ROOT, "bench/reference/#{file}.c")
      FileUtils.mkdir_p(File.dirname(binary))
      inputs = [source, File.join(ROOT, "bench/reference/reference.h")]
      return nil if File.exist?(binary) && File.mtime(binary) >= inputs.map { |f| File.mtime(f) }.max

      out, status = Open3.capture2e("cc", "-O2", "-Wall", "-o", binary, source, *libraries)
      status.success? ? nil : "does not build: #{out.lines.grep(/error/).first&.strip || out.lines.first&.strip}"
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
        median = median.merge(insight_medians(each_run)) if scenario == "insight-cost"
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
                  when "thread-server", "thread-clients" then threads_beside(subject, scenario)
                  when "write-pieces" then script("write_pieces.rb", subject, @size[:rounds])
                  when "timers" then timers(subject)
                  when "sleep-fanout" then script("sleep_fanout.rb", subject, @size[:sleep_scale])
                  when "fiber-memory" then fiber_memory(subject)
                  when "idle-connections" then idle(subject)
                  when "close-waiters" then close_waiters(subject)
                  when "blocking-ops" then blocking_ops(subject)
                  when "http-cpu" then http_cpu(subject)
                  when "falcon" then falcon(subject, app)
                  when "rails" then rails(subject, app)
                  when "insight-cost" then insight_cost(subject)
                  end
        row.merge(figures)
      end
    rescue Failure, Timeout::Error, SystemCallError => e
      row.merge(error: e.message.lines.first.strip, **(e.is_a?(Failure) ? e.details : {}))
    end

    def not_applicable(scenario, subject)
      if subject == "fibers" && !%w[http-keepalive http-close].include?(scenario)
        return "Ruby's floor for a fiber per connection: http-keepalive and http-close only"
      end
      if scenario == "http-redis"
        return "the C servers have no Redis client" if C_SERVERS.key?(subject)
        return "one connection at a time: threads is the scheduler-less row" if subject == "blocking"
      end
      if scenario == "http-cpu" && subject.start_with?("evt-ractors-") && Integer(subject[/\d+\z/]) > 1 && !parallel_ractors?
        return "Ruby #{RUBY_VERSION} crashes with fibers in two Ractors at once (ruby/ruby#13466)"
      end
      if subject == "c-blocking" && scenario == "http-keepalive"
        return "one connection at a time: the other keep-alive connections would wait for it to end"
      end
      return nil if scenario.start_with?("http-") || CORE_SUBJECTS.key?(scenario) || %w[falcon rails].include?(scenario)
      return "an HTTP server only" if C_SERVERS.key?(subject)
      return "one thread cannot block on several readers" if scenario == "close-waiters" && subject == "blocking"
      return "one thread cannot serve and read at once" if %w[big-reads thread-server thread-clients].include?(scenario) && subject == "blocking"
      return "one thread cannot hold #{@size[:idle]} waiting connections" if scenario == "idle-connections" && subject == "blocking"
      return "#{@size[:fibers]} sleepers need fibers or as many threads" if scenario == "timers" && %w[blocking threads].include?(subject)
      return "the fibers are a scheduler's" if scenario == "fiber-memory" && %w[blocking threads].include?(subject)
      return "the work is fibers on a scheduler" if scenario == "sleep-fanout" && %w[blocking threads].include?(subject)

      nil
    end
  end
end

Bench::Run.new(ARGV).call if $PROGRAM_NAME == __FILE__
