# frozen_string_literal: true

module Bench
  scenario "falcon",
           metric: :cpu_us_per_req,
           note: "(one server process, one Ruby thread, pinned to CPU 0; CPU us/req counts the server's process " \
                 "group; falcon-*: Falcon::Server as a `falcon serve` worker runs it, without the supervisor, on " \
                 "io-event's EPoll or URing selector or on evt's (IO_EVENT_SELECTOR=Evt with RUBYOPT=-revt/async; " \
                 "falcon-evt on evt's default backend, falcon-evt-epoll with EVT_BACKEND=epoll); itsi-*: the itsi " \
                 "command, workers 1, threads 1, fiber_scheduler Async::Scheduler (io-event's default selector) or " \
                 "Evt::Scheduler; x io-event: CPU us/req, and req/s, over the same server's best io-event row; " \
                 "a server that stops answering fails its row; its stderr: tmp/bench/falcon.<subject>.<app>.stderr)"

  # falcon: Rack servers on a fiber scheduler, with subjects of their own: Falcon on io-event's
  # selectors and on evt's (IO_EVENT_SELECTOR=Evt), and Itsi with async's scheduler and evt's.
  FALCON_SUBJECTS = %w[falcon-epoll falcon-uring falcon-evt falcon-evt-epoll itsi-async itsi-evt].freeze
  # falcon's apps (bench/servers/rack_apps.rb), a table each: name => title.
  FALCON_APPS = {"hello" => "hello", "sleep" => "sleep 1 ms"}.freeze
  # falcon: the rows each server's evt rows are compared with (the best of them).
  FALCON_BASELINES = {"falcon" => %w[falcon-epoll falcon-uring], "itsi" => %w[itsi-async]}.freeze
  # falcon: seconds a GET waits for its answer after each wrk run, and wrk's --timeout: a server that
  # stops answering fails its row rather than hanging it or passing with a few requests.
  FALCON_PROBE = 2
  # falcon: the columns of each app's table (Report.table_columns).
  FALCON_COLUMNS = [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.2f"], [:p99_ms, "p99 ms", "%.2f"],
                    [:errors, "errors", "%d"], [:vs_io_event, "x io-event", "%.2f"], [:rps_vs_io_event, "req/s x i-e", "%.2f"],
                    [:loop, "loop", "%s"]].freeze

  # falcon: Falcon and Itsi serving Rack apps on io-event's selectors and on evt's.
  module FalconScenario
    private

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
      [[*ruby, "-rbundler/setup", "bench/servers/falcon_server.rb", app], {"IO_EVENT_SELECTOR" => selector},
       /\A#<IO::Event::Selector::#{selector}\b/, "io-event's #{selector}"]
    when /\Afalcon-evt(?:-(\w+))?\z/
      # How an application switches: the selector's name, and evt/async loaded before async makes it.
      backend = Regexp.last_match(1)
      env = {"IO_EVENT_SELECTOR" => "Evt", "EVT_BACKEND" => backend,
             "RUBYOPT" => [ENV.fetch("RUBYOPT", nil), "-I#{ROOT}/lib", "-revt/async"].compact.join(" ")}
      [[*ruby, "-rbundler/setup", "bench/servers/falcon_server.rb", app], env, /\A#<Evt::Selector #{backend || "\\w+"}\b/,
       "Evt::Selector#{" on #{backend}" if backend}"]
    when /\Aitsi-(async|evt)\z/
      scheduler = Regexp.last_match(1) == "evt" ? "Evt::Scheduler" : "Async::Scheduler"
      [[*ruby, "-rbundler/setup", "bench/servers/itsi_server.rb", scheduler, app], {"EVT_BACKEND" => nil, "IO_EVENT_SELECTOR" => nil},
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
      raise server_failure(e, log, (soak_death(server, log) if ended?(server)))
    ensure
      stop(server)
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

  # A table per app; a failed row shows the start of its server's stderr.
  def print_falcon
    columns = table_columns("falcon")
    titles = FALCON_APPS.to_h { |app, title| [app, "falcon (#{title}) (#{description("falcon")}; lower cpu_us_per_req is better)"] }
    print_app_tables("falcon", titles, columns, NOTES["falcon"])
  end
  end
end
