# frozen_string_literal: true

require "pathname"
require "time"

module Bench
  # The Markdown report of one bin/bench run, made from its JSON alone: what ran, where, when and
  # at which commit, the chart, then a section per scenario with bin/bench's own table (the columns
  # of Report.table_columns, so the two cannot differ), the metric the rows are medians by, and
  # every run's figure where the run was repeated. Files from before bin/bench recorded the
  # command, the machine and the scenarios' descriptions say "not recorded" where those would be.
  #
  #   Bench::Markdown.new(JSON.parse(text, symbolize_names: true), chart: "latest.svg").to_s
  class Markdown
    NOT_RECORDED = "not recorded"

    # +document+: the results file, parsed with symbolize_names; +chart+ and +source+: the SVG's
    # and the JSON's paths relative to the report (Markdown.link), or nil.
    def initialize(document, chart: nil, source: nil)
      @document = document
      @chart = chart
      @source = source
      @results = document.fetch(:results)
      @recorded = document[:scenarios] || {}
    end

    # +target+'s path relative to the directory of +report+ (both paths as the caller has them).
    def self.link(report, target)
      Pathname(File.expand_path(target)).relative_path_from(Pathname(File.expand_path(File.dirname(report)))).to_s
    end

    def to_s
      out = [title, "", *header, ""]
      out += ["![chart](#{@chart})", ""] if @chart
      out << "Every scenario is judged by one figure, its metric (**bold** in its table): lower is better. " \
             "n/a: the subject cannot run that scenario here, and why; FAILED: the measurement failed, and how."
      scenarios.each { |scenario| out += ["", *section(scenario)] }
      "#{out.join("\n").gsub(/\n{3,}/, "\n\n")}\n"
    end

    # The scenarios in the order they ran: those the file describes, then any other its rows name.
    def scenarios
      (@recorded.keys.map(&:to_s) + @results.map { |r| r[:scenario] }).uniq
    end

    private

    def title
      yjit = " with YJIT" if @document[:yjit]
      "# bin/bench: Ruby #{@document[:ruby]}#{yjit}, #{@document[:date]}#{", #{@document[:run]} run" if @document[:run]}"
    end

    def header
      rows = [["machine", machine], ["Ruby", ruby], ["date", date], ["command", code_or_not(@document[:command])],
              ["commit", commit], ["duration", duration], ["connections", connections], ["sizes", sizes]]
      environment = @document[:environment]
      if environment
        rows << ["environment", environment.empty? ? "no RUBY_*, RUBYOPT or EVT_* variable set" : environment.map { |name, value| "#{name}=#{value}" }.join(" ")]
      end
      emulated = @document[:emulated] || {}
      emulated.each do |subject, emulation|
        rows << ["emulated", "#{subject}: #{emulation}, not a figure of the kernel's own mechanism"]
      end
      rows << ["results", "[#{File.basename(@source)}](#{@source})"] if @source
      ["| | |", "|---|---|", *rows.map { |name, value| "| #{name} | #{escape(value)} |" }]
    end

    def machine
      m = @document[:machine]
      return "#{NOT_RECORDED} (#{@document[:cores]} cores)" unless m

      os = [m[:os], ("Linux #{m[:kernel]}" if m[:kernel])].compact.join(", ")
      "#{m[:cpu] || "CPU #{NOT_RECORDED}"}, #{m[:cores] || @document[:cores]} cores; #{os.empty? ? "OS #{NOT_RECORDED}" : os}"
    end

    def ruby
      yjit = case @document[:yjit]
             when true then "YJIT on (--yjit)"
             when false then "YJIT off"
             else "YJIT #{NOT_RECORDED}"
             end
      "#{@document[:ruby]}, #{yjit}"
    end

    def date
      return "#{@document[:date]} (the time #{NOT_RECORDED})" unless @document[:started_at]

      "#{@document[:started_at]} to #{@document[:finished_at] || NOT_RECORDED}"
    end

    def commit
      git = @document[:git]
      return NOT_RECORDED unless git

      state = case git[:dirty]
              when true
                "with changes the commit does not hold (the tree was dirty#{": #{git[:changes].join(", ")}" if git[:changes]&.any?})"
              when false then "clean tree"
              else "whether the tree was dirty: #{NOT_RECORDED}"
              end
      "`#{git[:commit]}`, #{state}"
    end

    def duration
      return NOT_RECORDED unless @document[:started_at] && @document[:finished_at]

      seconds = (Time.iso8601(@document[:finished_at]) - Time.iso8601(@document[:started_at])).round
      hours, rest = seconds.divmod(3600)
      minutes, seconds = rest.divmod(60)
      [("#{hours} h" if hours.positive?), ("#{minutes} min" if minutes.positive?), "#{seconds} s"].compact.join(" ")
    end

    def connections
      return NOT_RECORDED unless @document[:connections]

      limit = @document[:descriptor_limit]
      text = "#{@document[:connections]} (wrk's, in the HTTP scenarios)"
      return text unless limit

      raised = limit[:before] == limit[:after] ? "" : ", raised from #{limit[:before]}"
      "#{text}; descriptor limit #{limit[:after]}#{raised}"
    end

    def sizes
      parts = ["#{@document[:run] || NOT_RECORDED} run"]
      parts << "HTTP measurements of #{@document[:http_duration_s]} s" if @document[:http_duration_s]
      parts << "soak #{@document[:soak_duration_s]} s per backend" if @document[:soak_duration_s]
      parts.join(", ")
    end

    def code_or_not(text)
      text ? "`#{text}`" : NOT_RECORDED
    end

    # A scenario's heading, description, table(s) and note.
    def section(scenario)
      rows = @results.select { |r| r[:scenario] == scenario }
      info = @recorded[scenario.to_sym] || {}
      out = ["## #{scenario}", ""]
      out << (info[:description] ? "#{info[:description]}." : "Description and note: #{NOT_RECORDED} in this file.")
      metric = metric(scenario)
      if metric
        recorded = info[:metric] ? "" : " (#{NOT_RECORDED} in this file: the metric bin/bench declares for it now)"
        out << "" << "Metric: `#{metric}`#{recorded}, lower is better.#{median_sentence(rows, metric)}"
      end
      out << ""
      out += case scenario
             when "falcon", "rails" then app_tables(scenario, rows, metric)
             when "close-waiters" then close_waiters(rows, metric)
             when "soak" then soak(rows)
             else table(rows, Report.table_columns(scenario), metric) + peers(rows) + syscalls_by_call(rows)
             end
      out += ["", info[:note]] if info[:note]
      out
    end

    def metric(scenario)
      (@recorded.dig(scenario.to_sym, :metric) || METRICS[scenario])&.to_sym
    end

    def median_sentence(rows, metric)
      runs = rows.filter_map { |r| r[:repeat_runs]&.size }.max or return ""
      " Each row is the median of #{runs} runs by it; the last column has every run's `#{metric}`."
    end

    # A Markdown table: the subject (unless +subject+ is false), +columns+ ([key, title, format]),
    # every run's figure where the run was repeated; n/a and failed rows say so in the first column
    # after the subject.
    def table(rows, columns, metric, subject: true, bold: metric)
      repeated = rows.any? { |r| r[:repeat_runs] }
      titles = columns.map { |key, title, _| key == bold ? "**#{title}**" : title }
      titles << "runs: #{metric}" if repeated
      aligns = columns.map { |_, _, fmt| fmt == "%s" ? "---" : "---:" } + (repeated ? ["---"] : [])
      out = [line([*("subject" if subject), *titles]), line([*("---" if subject), *aligns], raw: true)]
      rows.each do |row|
        cells = if (why = unmeasured(row))
                  [why, *Array.new(titles.size - 1, "")]
                else
                  columns.map { |key, _, fmt| Report.cell(row[key], fmt) } + (repeated ? [runs(row)] : [])
                end
        out << line([*(row[:subject] if subject), *cells])
      end
      out + failures(rows)
    end

    def line(cells, raw: false)
      "| #{cells.map { |c| raw ? c : escape(c) }.join(" | ")} |"
    end

    def unmeasured(row)
      return "n/a: #{row[:skipped]}" if row[:skipped]
      return nil unless row[:error]

      repeats = @results.filter_map { |r| r[:repeat_runs]&.size if r[:scenario] == row[:scenario] }.max
      failed = " (in #{row[:failed_runs]}#{" of #{repeats}" if repeats} runs)" if row[:failed_runs].to_i.positive?
      "FAILED: #{row[:error]}#{failed}"
    end

    def runs(row)
      row[:repeat_runs] ? row[:repeat_runs].map { |v| v.is_a?(Integer) ? v.to_s : format("%.4g", v) }.join(", ") : ""
    end

    # The start of a failed server's stderr, where the row kept it.
    def failures(rows)
      rows.select { |r| r[:error] && (r[:stderr]&.any? || r[:stderr_file]) }.flat_map do |row|
        lines = ["", "#{row[:subject]} failed#{" (its stderr: `#{row[:stderr_file]}`)" if row[:stderr_file]}" \
                     "#{":" if row[:stderr]&.any?}"]
        lines += ["", "```", *row[:stderr].first(8).map { |l| l.to_s[0, 200] }, "```"] if row[:stderr]&.any?
        lines
      end
    end

    # The system calls behind syscalls/req, by call, the most made first (the strace run's).
    def syscalls_by_call(rows)
      lines = rows.select { |r| r[:syscalls_by_call]&.any? }.map do |row|
        "- #{row[:subject]}: #{row[:syscalls_by_call].map { |name, n| "#{name} #{format("%.2f", n)}" }.join(", ")}"
      end
      lines.empty? ? [] : ["", "System calls per request, by call:", "", *lines]
    end

    def peers(rows)
      out = []
      best = rows.find { |r| r[:best_peer] }
      out << "Best peer (x best peer is over its figure): #{best[:best_peer]}." if best
      c = rows.find { |r| r[:best_c] }
      out << "Best C reference (x C is over its figure): #{c[:best_c]}." if c
      fastest = rows.find { |r| r[:fastest_peer] }
      out << "Peer with the most req/s (req/s x peer is over its req/s): #{fastest[:fastest_peer]}." if fastest
      out.empty? ? [] : ["", out.join(" ")]
    end

    # falcon and rails: a table per app, each row against the best io-event row of its server.
    def app_tables(scenario, rows, metric)
      rows.group_by { |r| r[:app] }.flat_map do |app, same|
        baseline = same.find { |r| r[:io_event_row] }&.dig(:io_event_row)
        ["### #{app_title(scenario, app)}", "", *table(same, Report.table_columns(scenario), metric), "",
         *("x io-event is over #{baseline}, the best io-event row here." if baseline), ""]
      end
    end

    # "falcon: sleep 1 ms", "rails: a 50 ms query, GET /db", as bin/bench titles their tables.
    def app_title(scenario, app)
      title = if scenario == "rails" && RailsScenario::APPS[app]
                path, text, = RailsScenario::APPS[app]
                "#{text}, GET #{path}"
              elsif scenario == "falcon"
                FALCON_APPS[app]
              end
      "#{scenario}: #{title || app}"
    end

    # close-waiters: the close's time and the readers woken at each N; the metric is the time at
    # the largest N.
    def close_waiters(rows, metric)
      sizes = rows.flat_map { |r| (r[:points] || []).map { |p| p[:n] } }.uniq.sort
      columns = sizes.flat_map { |n| [[:"us@#{n}", "us@#{n}", "%.2f"], [:"woken@#{n}", "woken@#{n}", "%s"]] }
      columns << [:flat, "us@max/us@min", "%.2f"]
      cells = rows.map do |row|
        next row if unmeasured(row)

        row.merge(sizes.to_h { |n| [:"us@#{n}", point(row, n)[:close_avg_us]] })
           .merge(sizes.to_h { |n| [:"woken@#{n}", woken(point(row, n))] })
      end
      table(cells, columns, metric, bold: :"us@#{sizes.last}") + ["", "`#{metric}` is the time at the largest N, `us@#{sizes.last}`."]
    end

    def point(row, n)
      row[:points].find { |p| p[:n] == n } || {}
    end

    def woken(point)
      return "FAILED: #{point[:error]}" if point[:error]
      return nil unless point[:woken]

      "#{point[:woken]}#{" HANG" if point[:hang]}"
    end

    # soak: per backend its rows over time, what went wrong, its verdict.
    def soak(rows)
      out = ["Targets: #{SOAK_TARGETS}."]
      rows.each do |row|
        out << ""
        next out << "### #{row[:subject]}" << "" << "n/a: #{row[:skipped]}" if row[:skipped]

        out << "### #{row[:subject]}: #{row[:duration_s]} s, a row every #{row[:interval_s]} s" << ""
        columns = SOAK_COLUMNS.map { |key, title, _, fmt| [key, title, fmt] }
        out += table((row[:intervals] || []).map { |interval| SoakScenario.soak_cells(interval) }, columns, nil, subject: false)
        problems = SoakScenario.soak_problems(row)
        out += ["", *problems.map { |line| "- #{line.strip}" }] if problems.any?
        out << "" << "Verdict #{row[:subject]}: **#{row[:verdict]}**"
      end
      measured = rows.reject { |r| r[:skipped] }
      if measured.size > 1
        passed, failed = measured.partition { |r| r[:pass] }
        out << "" << "soak: #{[("PASS on #{passed.map { |r| r[:subject] }.join(", ")}" if passed.any?),
                               ("FAIL on #{failed.map { |r| r[:subject] }.join(", ")}" if failed.any?)].compact.join("; ")}."
      end
      out
    end

    # A table cell's text: one line, the pipe escaped.
    def escape(text)
      text.to_s.gsub("\n", " ").gsub("|", "\\|")
    end
  end
end
