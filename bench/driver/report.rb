# frozen_string_literal: true

module Bench
  # The figures: each scenario's metric, the ratios, the tables on stdout, the JSON and the chart.
  # Mixed into Run.
  module Report
    private

  # What each scenario is judged by: lower is better for all of them.
  def metric(scenario)
    METRICS.fetch(scenario)
  end

  def add_ratios(scenario)
    return add_falcon_ratios if scenario == "falcon"
    return add_rails_ratios if scenario == "rails"

    key = metric(scenario)
    rows = @results.select { |r| r[:scenario] == scenario && r[key] }
    # close-waiters: a row's figure is at the largest N it reached; compare only those at the largest.
    largest = rows.filter_map { |r| r[:n] }.max
    rows = rows.select { |r| r[:n] == largest } if largest
    c = Bench.best_c(rows, key)
    # A peer that left readers hanging, or had errors, did not do the job, however fast.
    # The core scenarios compare evt one way against evt the other (a peer there is a reference).
    core = CORE_SUBJECTS.key?(scenario)
    best_peer = rows.select { |r| PEERS.include?(r[:subject]) && !r[:hang] && r[:errors].to_i.zero? }.min_by { |r| r[key] } unless core
    first = rows.first if core
    rows.each do |row|
      if first && row != first
        row[:vs_first] = (row[key] / first[key]).round(2)
        row[:rps_vs_first] = row[:rps].fdiv(first[:rps]).round(2) if row[:rps]
      end
      if c && row != c
        row[:vs_c] = (row[key] / c[key]).round(2)
        row[:best_c] = c[:subject]
      end
      row[:vs_best_peer] = row[key].fdiv(best_peer[key]).round(2) if best_peer
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

  # The columns of +scenario+'s table, [key, title, format] each: the table on stdout and the
  # Markdown report (bench/driver/markdown.rb, as Report.table_columns) both take them from here.
  # falcon's and rails' are those of each app's table; close-waiters and soak have layouts of their own.
  def table_columns(scenario)
    return FALCON_COLUMNS if scenario == "falcon"
    return RailsScenario::COLUMNS if scenario == "rails"

    return INSIGHT_COLUMNS if scenario == "insight-cost"

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
              elsif %w[thread-server thread-clients].include?(scenario)
                [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"], [:downloads_per_s, "downloads/s", "%.0f"]]
              elsif scenario == "sleep-fanout"
                [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"], [:idle_cpu_pct, "idle CPU %", "%.2f"],
                 [:timeouts_s, "timeouts s", "%.3f"], [:pool_s, "pool s", "%.3f"], [:fanout_s, "fanout s", "%.3f"]]
              elsif scenario == "idle-connections"
                [[:rss_mb, "RSS MB", "%.1f"]]
              elsif scenario == "fiber-memory"
                [[:bytes_per_fiber, "bytes/fiber", "%d"], [:sleeping_bytes, "sleeping", "%d"], [:socket_bytes, "on a socket", "%d"],
                 [:rss_mb, "RSS MB", "%.1f"]]
              else
                [[:seconds, "seconds", "%.3f"], [:cpu_seconds, "CPU s", "%.3f"]] +
                  (if scenario == "timers"
                     [[:rss_mb, "peak RSS MB", "%.1f"], [:late_us, "late us", "%.1f"], [:late_p99_us, "late p99 us", "%.1f"],
                      [:idle_cpu_pct, "idle CPU %", "%.2f"]]
                   else []
                   end)
              end
    columns << [:vs_best_peer, "x best peer", "%.2f"] unless CORE_SUBJECTS.key?(scenario)
    columns
  end
  module_function :table_columns

  def print_table(scenario)
    return print_falcon if scenario == "falcon"
    return print_rails if scenario == "rails"
    return print_close_waiters if scenario == "close-waiters"
    return print_soak if scenario == "soak"

    rows = @results.select { |r| r[:scenario] == scenario }
    columns = table_columns(scenario)
    puts
    puts "#{scenario} (#{description(scenario)}; lower #{metric(scenario)} is better)"
    puts format("%-13s", "subject") + columns.map { |_, title, _| format(" %13s", title) }.join
    rows.each { |row| puts table_line(row, columns, 13, 13) }
    best = rows.find { |r| r[:best_peer] }
    puts "best peer: #{best[:best_peer]}" if best
    fastest = rows.find { |r| r[:fastest_peer] }
    puts "peer with the most req/s: #{fastest[:fastest_peer]}" if fastest
    print_repeats(rows, metric(scenario))
    puts NOTES[scenario] if NOTES[scenario]
    $stdout.flush
  end

  # One row of a table: the subject in +label+ columns, then each column's cell in +width+, or why
  # the row has none.
  def table_line(row, columns, label, width)
    format("%-#{label}s", row[:subject]) +
      if row[:skipped] then "  n/a: #{row[:skipped]}"
      elsif row[:error] then "  FAILED: #{row[:error]}"
      else columns.map { |key, _, fmt| format(" %#{width}s", cell(row[key], fmt)) }.join
      end
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
        puts table_line(row, columns, 20, 12)
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
  module_function :cell

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
    when "http-keepalive" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive; blocking and fibers with -c1"
    when "http-close" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, Connection: close"
    when "http-redis" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive, a Redis GET per request, pool of #{@redis_pool}"
    when "pipe-pingpong" then "#{@size[:pairs]} pipe pairs x #{@size[:messages]} x 1 KiB"
    when "big-reads" then "#{@size[:big_clients]} Net::HTTP clients x #{@size[:big_rounds]} bodies of 512 KiB from a server in the same process"
    when "thread-server", "thread-clients"
      "#{@size[:beside_clients]} Net::HTTP clients x #{@size[:beside_rounds]} bodies of 256 KiB, " \
        "#{scenario == "thread-server" ? "fiber clients, a server of threads" : "a fiber server, thread clients"}"
    when "write-pieces" then "#{@size[:rounds]} keep-alive requests from a client without a scheduler; mean round trip"
    when "timers" then "#{@size[:fibers]} fibers sleeping 0-100 ms; then one fiber sleeping 1, 2, 5 ms x 100"
    when "sleep-fanout" then "fibers sleeping 1-3 ms in timeouts, a pool and fan-outs, scale #{@size[:sleep_scale]}"
    when "fiber-memory" then "#{@size[:fibers]} fibers alive and waiting: half sleeping, half reading sockets"
    when "idle-connections" then "#{@size[:idle]} idle connections, a reader waiting on each"
    when "close-waiters" then "N = #{@size[:waiters].join(", ")} readers blocked on N pipes, every read end closed"
    when "blocking-ops" then "#{@size[:deflates]} fibers each deflating #{@size[:deflate_mib]} MiB with Zlib"
    when "http-cpu" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s, keep-alive, 0.5 ms of Ruby per request"
    when "insight-cost"
      "three wrk -t1 -c#{@connections} -d#{INSIGHT_ROUND_SECONDS}s at once per round, #{@size[:insight_rounds]} rounds per " \
        "load, keep-alive then Connection: close"
    when "falcon" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s --timeout #{FALCON_PROBE}s, keep-alive"
    when "rails" then "wrk -t1 -c#{@connections} -d#{@size[:duration]}s --timeout #{RailsScenario::TIMEOUT}s, keep-alive"
    when "soak"
      "#{@size[:soak]} s of mixed load on one server per C backend, one backend at a time: " \
        "#{Soak::LOADS.map { |c, headers| "wrk -t1 -c#{c} #{headers.empty? ? "keep-alive" : "Connection: close"}" }.join(" and ")} " \
        "at once#{soak_paced_text(soak_pace)}; #{Soak::PINGPONG_PAIRS} pipe pairs ping-ponging checked messages; " \
        "#{Soak::SLEEPERS} fibers sleeping " \
        "0-10 ms; #{Soak::TIMEOUT_FIBERS} fibers in Timeout.timeout(2-10 ms) around sleeps, Queue#pop and pipe reads; " \
        "#{Soak::PRODUCERS} threads feeding #{Soak::PRODUCERS * Soak::QUEUES_PER_PRODUCER} queues that fibers pop; " \
        "pipes fibers read or write closed by a fiber (#{Soak::FIBER_CLOSE_SLOTS} at a time) or a thread " \
        "(#{Soak::THREAD_CLOSE_SLOTS})"
    end
  end

  # The JSON holds every scenario; the chart every one but those run on request (soak's rows over
  # time are no bar, insight-cost's costs no figure of a subject against others).
  # A run with nothing to chart leaves the chart file as it was. Returns the files written.
  def write_outputs
    document = {ruby: RUBY_VERSION, yjit: @options[:yjit], cores: @cores, date: Time.now.utc.strftime("%Y-%m-%d"),
                run: @options[:quick] ? "quick" : "full", http_duration_s: @size[:duration],
                connections: @connections, descriptor_limit: @descriptors.slice(:before, :after),
                default_backend: @default_backend, **provenance,
                results: @results}
    document[:soak_duration_s] = @size[:soak] if @options[:only].include?("soak")
    document[:soak_rate] = @options[:soak_rate] if @options[:only].include?("soak") && @options[:soak_rate]
    [@options[:json], @options[:svg]].each { |f| Dir.mkdir(File.dirname(f)) unless Dir.exist?(File.dirname(f)) }
    File.write(@options[:json], "#{JSON.pretty_generate(document)}\n")
    charted = @results.reject { |r| ON_REQUEST.include?(r[:scenario]) }
    File.write(@options[:svg], Chart.new(document.merge(results: charted)).to_svg) unless charted.empty?
    chart = @options[:svg] unless charted.empty?
    [@options[:json], *chart, *write_report(chart)]
  end
  end
end
