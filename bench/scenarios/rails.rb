# frozen_string_literal: true

require_relative "../../test/support/servers"

module Bench
  scenario "rails", metric: :cpu_us_per_req

  # The rails scenario: apps/rails/app.rb (Rails 8, ActiveRecord on a PostgreSQL of its own) under
  # Puma's threads and under Falcon on io-event's selectors and on evt's, wrk on two endpoints.
  # Mixed into Run; uses its servers, wrk and CPU accounting.
  module RailsScenario
    # Endpoints, a table each: name => [path, title, the body a check GET must get].
    APPS = {"db" => ["/db", "a 50 ms query", "db"], "instant" => ["/instant", "an instant answer", "ok"]}.freeze
    # Puma's default threads (Rails' RAILS_MAX_THREADS) and a larger pool; ActiveRecord's pool matches.
    PUMA_THREADS = [3, 32].freeze
    # Falcon's ActiveRecord pool: fibers cost little, the pool is what PostgreSQL is given.
    FALCON_POOL = 32
    # wrk's --timeout: Puma with 3 threads queues the connections for seconds at the 50 ms endpoint.
    TIMEOUT = 10
    NOTE = "(one server process pinned to CPU 0, wrk on CPU 1, PostgreSQL unpinned; RAILS_ENV=production; " \
           "puma-N: Puma with N threads and a pool of N; falcon-*: Falcon::Server as a `falcon serve` worker runs it, " \
           "pool #{FALCON_POOL}, on io-event's EPoll or URing selector or on evt's (IO_EVENT_SELECTOR=Evt, " \
           "RUBYOPT=-revt/async, EVT_BACKEND); CPU us/req counts the server's process; x io-event: CPU us/req over " \
           "the best io-event row; req/s x puma: req/s over the best Puma row; a server's stderr: " \
           "tmp/bench/rails.<subject>.<app>.stderr)"
    # The columns of each endpoint's table (Report.table_columns).
    COLUMNS = [[:rps, "req/s", "%.0f"], [:cpu_us_per_req, "CPU us/req", "%.1f"], [:p99_ms, "p99 ms", "%.1f"],
               [:errors, "errors", "%d"], [:pool, "pool", "%d"], [:vs_io_event, "x io-event", "%.2f"],
               [:rps_vs_puma, "req/s x puma", "%.2f"]].freeze

    # Stand-in for a test: a server that cannot start fails the rows.
    Skipper = Struct.new(:run) do
      def skip(reason) = raise(Failure, reason)
    end

    def rails_subject_names
      PUMA_THREADS.map { |n| "puma-#{n}" } + %w[falcon-epoll falcon-uring] + evt_backends.map { |backend| "falcon-evt-#{backend}" }
    end

    def rails_subjects
      names = rails_subject_names
      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      problem = rails_problem
      names.map { |name| [name, problem] }
    end

    # Why the app cannot run (its gems are not installed), or nil.
    def rails_problem
      out, status = Open3.capture2e(rails_env, *ruby, "-S", "bundle", "check", chdir: ROOT)
      status.success? ? nil : "apps/rails/Gemfile's gems are not installed (bin/setup): #{out.lines.last&.strip}"
    end

    def rails_env
      {"BUNDLE_GEMFILE" => File.join(ROOT, "apps/rails/Gemfile"), "BUNDLE_WITH" => nil, "BUNDLE_FROZEN" => "true",
       "BUNDLE_LOCKFILE" => nil, "BUNDLER_SETUP" => nil, "BUNDLE_BIN_PATH" => nil, "RUBYLIB" => nil,
       "BUNDLE_PATH" => File.join(ENV.fetch("XDG_CACHE_HOME") { File.join(Dir.home, ".cache") }, "evt", "rails-gems")}
    end

    # PostgreSQL for the whole scenario (test/support/servers.rb's), started at first use.
    def rails_postgres
      @rails_postgres ||= EvtTest::Servers.postgres(Skipper.new(self))
    end

    def rails(subject, app)
      path, _title, expected = APPS.fetch(app)
      log = File.join(ROOT, "tmp/bench/rails.#{subject}.#{app}.stderr")
      FileUtils.mkdir_p(File.dirname(log))
      postgres = rails_postgres
      env = rails_env.merge("RAILS_ENV" => "production", "RAILS_LOG_LEVEL" => "error", "CONSOLE_LEVEL" => "fatal",
                            "DATABASE_URL" => "postgres://evt@127.0.0.1:#{postgres.port}/postgres",
                            "UPSTREAM_URL" => "http://127.0.0.1:1/", "RUBYOPT" => nil)
      command = [*ruby, "apps/rails/serve.rb"]
      case subject
      when /\Apuma-(\d+)\z/
        pool = Integer(Regexp.last_match(1))
        command += ["puma", pool.to_s]
        expected_loop = /\Apuma, #{pool} threads\z/
      when /\Afalcon-(epoll|uring)\z/
        pool = FALCON_POOL
        selector = Regexp.last_match(1) == "epoll" ? "EPoll" : "URing"
        env["IO_EVENT_SELECTOR"] = selector
        command << "falcon"
        expected_loop = /\Aselector #<IO::Event::Selector::#{selector}\b/
      when /\Afalcon-evt-(\w+)\z/
        pool = FALCON_POOL
        backend = Regexp.last_match(1)
        env.merge!("IO_EVENT_SELECTOR" => "Evt", "EVT_BACKEND" => backend, "RUBYOPT" => "-rbundler/setup -I#{ROOT}/lib -revt/async")
        command << "falcon"
        expected_loop = /\Aselector #<Evt::Selector #{backend}\b/
      end
      env["RAILS_POOL"] = pool.to_s
      server = nil
      begin
        server = start_server(command, err: log, env: env)
        runs_on = server[:line][/\((.*)\)\s*\z/, 1]
        raise Failure, "it runs on #{runs_on || "an unknown loop"}" unless runs_on&.match?(expected_loop)

        url = "http://127.0.0.1:#{server[:port]}#{path}"
        warmup = wrk(url, @connections, @size[:warmup], [], timeout: TIMEOUT)
        answers!(server[:port], "after #{warmup[:requests]} requests in the warm-up", expected, wait: TIMEOUT, path: path)
        before = group_cpu_seconds(server[:pid])
        report = wrk(url, @connections, @size[:duration], [], timeout: TIMEOUT)
        used = group_cpu_seconds(server[:pid]) - before
        answers!(server[:port], "after #{report[:requests]} requests in the run", expected, wait: TIMEOUT, path: path)
        {rps: report[:rps].round(0), cpu_us_per_req: (used * 1e6 / report[:requests]).round(2), p99_ms: report[:p99_ms],
         errors: report[:errors], connections: @connections, pool: pool, loop: runs_on.sub(/\Aselector /, "")[0, 40]}
      rescue Failure, Timeout::Error, SystemCallError => e
        raise server_failure(e, log)
      ensure
        stop(server)
      end
    end

    # Each row against the best io-event row (CPU per request) and the best Puma row (req/s).
    def add_rails_ratios
      rows = @results.select { |r| r[:scenario] == "rails" && r[:cpu_us_per_req] }
      rows.group_by { |r| r[:app] }.each_value do |same_app|
        io_event = same_app.select { |r| r[:subject].match?(/\Afalcon-(epoll|uring)\z/) }.min_by { |r| r[:cpu_us_per_req] }
        puma = same_app.select { |r| r[:subject].start_with?("puma-") }.max_by { |r| r[:rps] }
        same_app.each do |row|
          row[:vs_io_event] = (row[:cpu_us_per_req] / io_event[:cpu_us_per_req]).round(2) if io_event
          row[:rps_vs_puma] = row[:rps].fdiv(puma[:rps]).round(2) if puma
        end
      end
    end

    def print_rails
      columns = table_columns("rails")
      titles = APPS.to_h do |app, (path, title, _)|
        [app, "rails: #{title}, GET #{path} (#{description("rails")}; lower cpu_us_per_req is better)"]
      end
      print_app_tables("rails", titles, columns, NOTE)
    end
  end
end
