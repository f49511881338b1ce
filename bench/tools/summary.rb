# frozen_string_literal: true

# The README's summary of a bin/bench run: one Markdown table, a row per scenario (per app for
# falcon and rails), made from the results file alone. Each row: the scenario's metric (lower is
# better), the best C reference's figure (Bench.best_c), evt's default backend's and evt's best
# subject's figures and the default's over the best's, the best peer's (async-epoll, async-uring,
# carbon, uringmachine, threads: Bench::PEERS without the blocking and fibers reference rows; none
# for blocking-ops and http-cpu, which compare evt with itself), the default's and the best's over
# the best peer's, and the best's over C's. A row that hung or had errors takes no part. For falcon
# and rails: evt's best falcon-evt-* row against the best of falcon-epoll and falcon-uring, per
# app. A line under the table names the file, Ruby, YJIT, date and command, and links the full
# report (the .md beside the JSON, bench/tools/report.rb).
#
#   ruby bench/tools/summary.rb FILE.json                    the table, on stdout
#   ruby bench/tools/summary.rb [FILE.json] --readme README.md
#
# With --readme, the text between a line `<!-- bench-summary: PATH/TO/FILE.json -->` and the next
# `<!-- /bench-summary -->` is replaced with the summary of PATH/TO/FILE.json (relative to the
# README's directory), in every such block, or in those naming FILE.json when it is given (it must
# name one of them). Updating the README's figures is this command, not an edit:
# test/bench_summary_test.rb fails when a block differs from what this command makes.
require "json"
require_relative "../bench"

module Bench
  class Summary
    OPEN = /\A<!-- bench-summary: (\S+) -->\s*\z/
    CLOSE = /\A<!-- \/bench-summary -->\s*\z/
    # The peers a row compares evt with: the scheduler-less blocking and fibers rows are a reference.
    SUMMARY_PEERS = (PEERS - %w[blocking fibers]).freeze
    # falcon and rails: evt's rows, and the io-event rows they are compared with.
    EVT_FALCON = /\Afalcon-evt(-|\z)/
    IO_EVENT_FALCON = %w[falcon-epoll falcon-uring].freeze
    UNITS = {cpu_us_per_req: "CPU µs/req", seconds: "s", cpu_seconds: "CPU s", split_ms: "ms per round trip",
             rss_mb: "RSS MB", close_avg_us: "µs per close, largest N"}.freeze
    FIX = "run `ruby bench/tools/summary.rb --readme README.md`"

    # +document+: the results file parsed with symbolize_names; +path+: its path as the summary names
    # it (the report's is the same with .md).
    def initialize(document, path)
      @document = document
      @path = path
      @results = document.fetch(:results)
    end

    # The table and the line under it.
    def to_s
      lines = ["| scenario | metric, lower is better | C | evt's default | evt's best | default ÷ best | best peer | " \
               "default ÷ peer | best ÷ peer | best ÷ C |",
               "|---|---|---:|---|---|---:|---|---:|---:|---:|"]
      rows.each do |row|
        next lines << "| #{row[:label]} | #{row[:unit]} | — | — | #{row[:text]} | — | — | — | — | — |" if row[:text]

        key = row[:key]
        lines << "| #{row[:label]} | #{row[:unit]} | #{figure(row[:c], key)} | #{named(row[:default], key)} | " \
                 "#{named(row[:evt], key)} | #{ratio(row[:default], row[:evt], key)} | #{named(row[:peer], key)} | " \
                 "#{ratio(row[:default], row[:peer], key)} | #{ratio(row[:evt], row[:peer], key)} | #{ratio(row[:evt], row[:c], key)} |"
      end
      "#{lines.join("\n")}\n\n#{footer}\n"
    end

    # Subjects that ran on an emulation (evt-kqueue on Linux): never evt's best.
    def emulated
      @document[:emulated] || {}
    end

    # [{label:, unit:, key:, c:, default:, evt:, peer:}]: +key+ the metric, each of c, default, evt
    # and peer a row of the results (or nil); soak, which has no metric: [{label:, unit:, text:}],
    # its verdicts. A row that hung or had errors is never a best, nor the default's figure.
    def rows
      scenarios.flat_map do |scenario|
        next soak if scenario == "soak"
        next [] if scenario == "insight-cost" # evt against itself: no peer, no C

        key = metric(scenario) or next []
        same = @results.select { |r| r[:scenario] == scenario && r[key].is_a?(Numeric) && !r[:hang] && r[:errors].to_i.zero? }
        same = at_largest_n(same)
        unit = UNITS.fetch(key, key.to_s)
        if %w[falcon rails].include?(scenario)
          same.group_by { |r| r[:app] }.map do |app, per_app|
            {label: "#{scenario} (#{app_title(scenario, app)})", unit: unit, key: key, c: nil,
             default: default_row(per_app, scenario == "falcon" ? "falcon-evt" : "falcon-evt-%s"),
             evt: best(per_app.select { |r| r[:subject].match?(EVT_FALCON) }, key),
             peer: best(per_app.select { |r| IO_EVENT_FALCON.include?(r[:subject]) }, key)}
          end
        else
          peers = CORE_SUBJECTS.key?(scenario) ? [] : same.select { |r| SUMMARY_PEERS.include?(r[:subject]) }
          [{label: scenario, unit: unit, key: key, c: Bench.best_c(same, key),
            default: (default_row(same, "evt-%s") unless CORE_SUBJECTS.key?(scenario)),
            evt: best(same.select { |r| r[:subject].match?(/\Aevt(-|\z)/) && !emulated.key?(r[:subject].to_sym) }, key),
            peer: best(peers, key)}]
        end
      end
    end

    # The README's text with every summary block (those naming the file +only+, when given) made
    # anew; +base+: the directory the blocks' paths are relative to. Raises ArgumentError for a
    # block without its end, a text with none, or +only+ naming none of them.
    def self.update_readme(text, base:, only: nil)
      found = []
      out = blocks(text).map do |part|
        next part if part.is_a?(String)

        path, = part
        next part[1] if only && File.expand_path(only) != File.expand_path(path, base)

        found << path
        part[1].lines.first + generate(path, base) + part[1].lines.last
      end
      raise ArgumentError, "no `<!-- bench-summary: FILE.json -->` block#{" names #{only}" if only}" if found.empty?

      out.join
    end

    # What differs between the README's summary blocks and the summaries their files make now:
    # a message per block that differs, [] when every block is as this command makes it.
    def self.readme_problems(text, base:)
      blocks(text).reject { |part| part.is_a?(String) }.filter_map do |path, block|
        inside = block.lines[1..-2].join
        expected = generate(path, base)
        next if inside == expected

        "the summary of #{path} in the README is not what its JSON makes (#{difference(inside, expected)}): #{FIX}"
      rescue SystemCallError, JSON::ParserError => e
        "the summary block names #{path}, which cannot be read (#{e.message}): #{FIX}"
      end
    end

    # Where +have+ first differs from +want+, for the message.
    def self.difference(have, want)
      return "the block is empty" if have.strip.empty?

      have, want = have.lines, want.lines
      at = (0...[have.size, want.size].max).find { |i| have[i] != want[i] }
      "line #{at + 1} of the block is #{have[at]&.strip.inspect || "missing"}, " \
        "where #{want[at] ? want[at].strip.inspect : "nothing"} was expected"
    end

    # The summary between a block's marker lines: a blank line, the table, the line under it, a
    # blank line.
    def self.generate(path, base)
      document = JSON.parse(File.read(File.expand_path(path, base)), symbolize_names: true)
      "\n#{new(document, path)}\n"
    end

    # The text cut into strings outside the blocks and [path, block] for each block (its marker
    # lines included).
    def self.blocks(text)
      parts = []
      current = nil
      text.each_line do |line|
        if current
          current[1] << line
          if line.match?(CLOSE)
            parts << current
            current = nil
          end
        elsif (path = line[OPEN, 1])
          current = [path, +line]
        else
          parts.last.is_a?(String) ? parts.last << line : parts << +line
        end
      end
      raise ArgumentError, "`<!-- bench-summary: #{current[0]} -->` has no `<!-- /bench-summary -->` after it" if current

      parts
    end

    private

    def scenarios
      ((@document[:scenarios] || {}).keys.map(&:to_s) + @results.map { |r| r[:scenario] }).uniq
    end

    def metric(scenario)
      (@document.dig(:scenarios, scenario.to_sym, :metric) || METRICS[scenario])&.to_sym
    end

    def app_title(scenario, app)
      (scenario == "rails" ? RailsScenario::APPS.dig(app, 1) : FALCON_APPS[app]) || app
    end

    # soak: which backends passed, which failed.
    def soak
      measured = @results.select { |r| r[:scenario] == "soak" && !r[:skipped] }
      return [] if measured.empty?

      passed, failed = measured.partition { |r| r[:pass] }
      text = [("PASS on #{passed.map { |r| r[:subject] }.join(", ")}" if passed.any?),
              ("FAIL on #{failed.map { |r| r[:subject] }.join(", ")}" if failed.any?)].compact.join("; ")
      seconds = measured.map { |r| r[:duration_s] }.max
      [{label: "soak", unit: "targets: 0 errors, held memory and descriptors flat, #{seconds} s", text: text}]
    end

    def best(rows, key)
      rows.min_by { |r| r[key] }
    end

    # The row of the backend evt chose by default in that run (its name in +pattern+'s %s; a pattern
    # without one names it alone): nil where the file does not record the default.
    def default_row(rows, pattern)
      backend = @document[:default_backend] or return nil
      name = pattern.include?("%s") ? format(pattern, backend) : pattern
      rows.find { |r| r[:subject] == name }
    end

    # Three significant digits under 1, then two decimals under 10, then one.
    # close-waiters' rows carry the largest N each reached: only those at the scenario's largest N
    # compare (a subject that failed past some N would look fast at a smaller one).
    def at_largest_n(rows)
      largest = rows.filter_map { |r| r[:n] }.max or return rows
      rows.select { |r| r[:n] == largest }
    end

    def figure(row, key)
      return "—" unless row

      value = row[key]
      format(value < 1 ? "%.3f" : value < 10 ? "%.2f" : "%.1f", value)
    end

    def named(row, key)
      row ? "#{row[:subject]} #{figure(row, key)}" : "—"
    end

    def ratio(row, over, key)
      return "—" unless row && over

      quotient = row[key].fdiv(over[key])
      format(quotient < 0.1 ? "%.3f" : "%.2f", quotient)
    end

    def footer
      repeats = @results.filter_map { |r| r[:repeat_runs]&.size }.max
      yjit = {true => "YJIT", false => "no YJIT"}.fetch(@document[:yjit], "YJIT not recorded")
      command = @document[:command] ? "`#{@document[:command]}`" : "the command not recorded"
      report = @path.sub(/(\.json)?\z/, ".md")
      "`#{@path}`: Ruby #{@document[:ruby]}, #{yjit}, #{@document[:date]}, #{command}" \
        "#{"; medians of #{repeats} runs" if repeats}. Every table and run: [#{File.basename(report)}](#{report})."
    end
  end

  # The command line (see the top of this file).
  module SummaryCommand
    USAGE = "usage: ruby bench/tools/summary.rb FILE.json | ruby bench/tools/summary.rb [FILE.json] --readme README.md"

    def self.call(argv)
      readme = nil
      files = []
      args = argv.dup
      until args.empty?
        arg = args.shift
        case arg
        when "--readme" then readme = args.shift or abort USAGE
        when /\A--readme=(.+)\z/ then readme = Regexp.last_match(1)
        when /\A-/ then abort USAGE
        else files << arg
        end
      end
      abort USAGE if files.size > 1 || (files.empty? && !readme)
      return print(Summary.generate(files.first, Dir.pwd).strip + "\n") unless readme

      text = File.read(readme)
      base = File.dirname(File.expand_path(readme))
      updated = Summary.update_readme(text, base: base, only: files.first)
      File.write(readme, updated) unless updated == text
      Summary.blocks(updated).reject { |part| part.is_a?(String) }.each do |path, _|
        report = File.expand_path(path.sub(/(\.json)?\z/, ".md"), base)
        warn "bench/tools/summary.rb: #{path}'s report is missing: ruby bench/tools/report.rb #{path}" unless File.exist?(report)
      end
      puts updated == text ? "#{readme}: the summary was already up to date" : "#{readme}: summary updated"
    rescue ArgumentError, SystemCallError, JSON::ParserError => e
      abort "bench/tools/summary.rb: #{e.message}"
    end
  end
end

Bench::SummaryCommand.call(ARGV) if $PROGRAM_NAME == __FILE__
