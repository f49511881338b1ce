# frozen_string_literal: true

# Puts bin/bench result files side by side as one Markdown table: a column per file (a Ruby, with
# or without YJIT), a row per scenario and subject, each cell the scenario's figure (Bench::METRICS,
# lower is better; req/s too for the HTTP scenarios). Nothing is measured here: the figures are the
# files', each a median of its own run's --repeat.
#
#   ruby bench/tools/compare.rb LABEL=FILE [LABEL=FILE ...] [--scenarios NAME,..] [--subjects NAME,..]
require "json"
require_relative "../bench"

module Bench
  class Compare
    UNITS = {cpu_us_per_req: "CPU µs/req", seconds: "s", cpu_seconds: "CPU s", split_ms: "ms", rss_mb: "MB",
             close_avg_us: "µs"}.freeze
    HTTP = %w[http-keepalive http-close http-redis http-cpu].freeze

    def initialize(argv)
      @scenarios = @subjects = nil
      @files = []
      argv.each_with_index do |arg, i|
        case arg
        when "--scenarios" then @scenarios = argv[i + 1].split(",")
        when "--subjects" then @subjects = argv[i + 1].split(",")
        when /\A([^=]+)=(.+)\z/ then @files << [Regexp.last_match(1), JSON.parse(File.read(Regexp.last_match(2)))]
        end
      end
      abort "usage: ruby bench/tools/compare.rb LABEL=FILE [LABEL=FILE ...] [--scenarios a,b] [--subjects a,b]" if @files.empty?
    end

    def call
      puts "| scenario | subject | #{@files.map(&:first).join(" | ")} |"
      puts "|---|---|#{"---:|" * @files.size}"
      scenarios.each do |scenario|
        key = METRICS.fetch(scenario).to_s
        subjects(scenario).each do |subject|
          cells = @files.map { |_, document| cell(row(document, scenario, subject), key, scenario) }
          puts "| #{scenario} (#{UNITS.fetch(key.to_sym)}) | #{subject} | #{cells.join(" | ")} |"
        end
      end
    end

    private

    def row(document, scenario, subject)
      document["results"].find { |r| r["scenario"] == scenario && r["subject"] == subject }
    end

    def scenarios
      present = @files.flat_map { |_, d| d["results"].map { |r| r["scenario"] } }.uniq
      (@scenarios || SCENARIOS) & present
    end

    # Every subject with a figure in some file, in the order of the first file that has it.
    def subjects(scenario)
      key = METRICS.fetch(scenario).to_s
      names = @files.flat_map { |_, d| d["results"].select { |r| r["scenario"] == scenario && r[key] }.map { |r| r["subject"] } }
      names = names.uniq
      @subjects ? names & @subjects : names
    end

    def cell(row, key, scenario)
      return "n/a" unless row && row[key]

      figure = row[key].is_a?(Float) ? format("%.#{row[key] < 10 ? 2 : 1}f", row[key]) : row[key].to_s
      HTTP.include?(scenario) && row["rps"] ? "#{figure} (#{row["rps"].to_s.reverse.scan(/\d{1,3}/).join(",").reverse} req/s)" : figure
    end
  end
end

Bench::Compare.new(ARGV).call if $PROGRAM_NAME == __FILE__
