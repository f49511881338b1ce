# frozen_string_literal: true

# The Markdown report of a bin/bench results file, made from the JSON alone (bin/bench writes one
# beside its JSON at the end of every run; this makes it again, or for a file from before it did):
# the machine, Ruby and YJIT, date, command, commit, duration and connections, then every
# scenario's table as bin/bench printed it, the medians' metric and every repeated run's figure.
# What an older file did not record, the report says so. The chart is linked when the SVG of the
# same name lies beside the JSON.
#
#   ruby bench/tools/report.rb FILE.json [OUT.md]     (OUT.md: FILE.md beside the JSON)
#   for f in bench/results/*.json; do ruby bench/tools/report.rb "$f"; done
require "json"
require_relative "../bench"

module Bench
  # The command line: reads the JSON, writes the report, prints its path.
  module ReportCommand
    USAGE = "usage: ruby bench/tools/report.rb FILE.json [OUT.md]"

    def self.call(argv)
      abort USAGE unless (1..2).cover?(argv.size) && argv.none? { |a| a.start_with?("-") }
      json, out = argv
      out ||= json.sub(/(\.json)?\z/, ".md")
      document = JSON.parse(File.read(json), symbolize_names: true)
      svg = json.sub(/(\.json)?\z/, ".svg")
      chart = Markdown.link(out, svg) if File.exist?(svg)
      File.write(out, Markdown.new(document, chart: chart, source: Markdown.link(out, json)).to_s)
      puts out
    rescue SystemCallError, JSON::ParserError, KeyError => e
      abort "bench/tools/report.rb: #{json}: #{e.message}"
    end
  end
end

Bench::ReportCommand.call(ARGV) if $PROGRAM_NAME == __FILE__
