# frozen_string_literal: true

require "shellwords"

module Bench
  # What the JSON records besides the figures, so that a report can be made from it alone: the
  # command as run, when, on what machine and at which commit, and each scenario's description,
  # metric and note; and the Markdown report written beside the JSON. Mixed into Run.
  module Record
    private

  # The fields write_outputs adds to the document. Nothing here may cost the run its results: a
  # field that cannot be read is nil.
  def provenance
    {command: command_line, started_at: iso8601(@started_at), finished_at: iso8601(Time.now.utc),
     machine: machine, git: @git, environment: environment, scenarios: scenario_records, emulated: @emulated || {}}
  rescue StandardError => e
    note "bin/bench: the run's command, machine and scenarios are not recorded: #{e.class}: #{e.message}"
    {}
  end

  # bin/bench takes --ruby itself and passes the rest on (exec, so this process has its pid): it
  # exports the command line as given, with its pid. Run otherwise, the command is this script's.
  def command_line
    given = ENV.fetch("EVT_BENCH_COMMAND", nil)
    return given if given && ENV.fetch("EVT_BENCH_PID", nil) == Process.pid.to_s

    ["ruby", relative(File.expand_path("../bench.rb", __dir__)), *@argv].shelljoin
  end

  # The environment variables that change how Ruby or evt runs in every subject (RUBY_*, RUBYOPT,
  # EVT_*), as set for the run: a figure made with RUBY_GC_HEAP_0_INIT_SLOTS is not one made
  # without. bin/bench's own (EVT_BENCH_*) are left out.
  def environment
    ENV.to_h.select { |name, _| (name.start_with?("RUBY_", "EVT_") || name == "RUBYOPT") && !name.start_with?("EVT_BENCH_") }
       .sort.to_h
  end

  def iso8601(time)
    time&.strftime("%Y-%m-%dT%H:%M:%SZ")
  end

  # {cpu:, cores:, kernel:, os:}: the CPU's model name (/proc/cpuinfo), uname -r, PRETTY_NAME of
  # /etc/os-release.
  def machine
    {cpu: read_field("/proc/cpuinfo", /^(?:model name|Hardware|Model)\s*:\s*(.+)$/), cores: @cores,
     kernel: Etc.uname[:release], os: read_field("/etc/os-release", /^PRETTY_NAME="?([^"\n]*)"?$/)}
  end

  def read_field(path, pattern)
    File.read(path)[pattern, 1]&.strip
  rescue SystemCallError
    nil
  end

  # {commit:, dirty:, changes:} at the run's start: the short commit, whether the tree had changes
  # (files changed or not yet added) the commit does not hold, and their paths; nil outside a git
  # checkout.
  def git_state
    commit, status = Open3.capture2("git", "-C", ROOT, "rev-parse", "--short", "HEAD", err: File::NULL)
    return nil unless status.success?

    changes, status = Open3.capture2("git", "-C", ROOT, "status", "--porcelain", err: File::NULL)
    return {commit: commit.strip, dirty: nil} unless status.success?

    {commit: commit.strip, dirty: !changes.empty?, changes: changes.lines.map { |line| line[3..].strip }}
  rescue SystemCallError
    nil
  end

  # scenario => {description:, metric:, note:}, for the scenarios this run ran.
  def scenario_records
    @options[:only].to_h do |scenario|
      [scenario, {description: description(scenario), metric: METRICS[scenario],
                  note: NOTES[scenario] || (RailsScenario::NOTE if scenario == "rails")}]
    end
  end

  # The Markdown report of the JSON just written (--report, or the JSON's path with .md), made from
  # the file as a later `ruby bench/tools/report.rb` would make it; +chart+: the SVG this run wrote, or
  # nil. A report that fails says so and costs nothing else. Returns the files written.
  def write_report(chart)
    path = @options[:report] || @options[:json].sub(/(\.json)?\z/, ".md")
    document = JSON.parse(File.read(@options[:json]), symbolize_names: true)
    FileUtils.mkdir_p(File.dirname(path))
    File.write(path, Markdown.new(document, chart: chart && Markdown.link(path, chart),
                                            source: Markdown.link(path, @options[:json])).to_s)
    [path]
  rescue StandardError => e
    note "bin/bench: the Markdown report was not written: #{e.class}: #{e.message}"
    []
  end
  end
end
