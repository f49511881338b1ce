# frozen_string_literal: true

require "test_helper"
require "json"
require_relative "../bench/tools/summary"

# bin/bench's figures as data: the README's summary table is what bench/tools/summary.rb makes from the
# JSON its marker names (so a figure edited by hand fails here), the Markdown report renders every
# results file, and the summary picks the right rows. Nothing is measured: this reads saved JSON.
class BenchSummaryTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  README = File.join(ROOT, "README.md")
  FIX = "run `ruby bench/tools/summary.rb --readme README.md`"

  # A run, by hand: three C rows (one with errors), two evt rows, two peers, and rows the summary must pass over.
  DOCUMENT = {
    ruby: "3.4.5", yjit: false, date: "2026-11-26", command: "bin/bench --only http-keepalive,falcon --repeat 3",
    default_backend: "epoll",
    results: [
      {scenario: "http-keepalive", subject: "c-epoll", cpu_us_per_req: 4.0, repeat_runs: [4.1, 4.0, 3.9]},
      {scenario: "http-keepalive", subject: "c-uring", cpu_us_per_req: 3.5, errors: 12, repeat_runs: [3.5, 3.5, 3.5]},
      {scenario: "http-keepalive", subject: "c-blocking", cpu_us_per_req: 3.2, errors: 0, repeat_runs: [3.2, 3.2, 3.2]},
      {scenario: "http-keepalive", subject: "blocking", cpu_us_per_req: 3.0, repeat_runs: [3.0, 3.0, 3.0]},
      {scenario: "http-keepalive", subject: "evt-epoll", cpu_us_per_req: 6.0, repeat_runs: [6.0, 6.0, 6.0]},
      {scenario: "http-keepalive", subject: "evt-io_uring", cpu_us_per_req: 5.0, repeat_runs: [5.0, 5.0, 5.0]},
      {scenario: "http-keepalive", subject: "async-epoll", cpu_us_per_req: 8.0, repeat_runs: [8.0, 8.0, 8.0]},
      {scenario: "http-keepalive", subject: "async-uring", cpu_us_per_req: 6.25, repeat_runs: [6.25, 6.25, 6.25]},
      {scenario: "http-keepalive", subject: "carbon", error: "the server did not start", failed_runs: 3},
      {scenario: "http-keepalive", subject: "uringmachine", cpu_us_per_req: 2.0, errors: 40, repeat_runs: [2.0, 2.0, 2.0]},
      {scenario: "falcon", subject: "falcon-epoll", app: "hello", cpu_us_per_req: 55.0},
      {scenario: "falcon", subject: "falcon-uring", app: "hello", cpu_us_per_req: 50.0},
      {scenario: "falcon", subject: "falcon-evt", app: "hello", cpu_us_per_req: 45.0},
      {scenario: "falcon", subject: "falcon-evt-epoll", app: "hello", cpu_us_per_req: 40.0},
      {scenario: "falcon", subject: "itsi-async", app: "hello", cpu_us_per_req: 30.0},
    ],
  }.freeze

  def test_the_readme_summary_is_what_its_json_makes
    text = File.read(README)
    skip "README.md has no <!-- bench-summary: FILE.json --> block" unless blocks?(text)

    problems = Bench::Summary.readme_problems(text, base: ROOT)
    assert_empty problems, problems.join("\n")
  end

  # The check above catches a hand edit: a copy of the README, its summary made afresh, then one
  # figure changed.
  def test_a_figure_edited_by_hand_fails_the_check
    text = File.read(README)
    text = "# evt\n\n<!-- bench-summary: bench/results/latest.json -->\n<!-- /bench-summary -->\n" unless blocks?(text)
    fresh = Bench::Summary.update_readme(text, base: ROOT)
    assert_empty Bench::Summary.readme_problems(fresh, base: ROOT)

    lines = fresh.lines
    start = lines.index { |line| line.match?(Bench::Summary::OPEN) }
    at = (start + 1...lines.size).find { |i| lines[i].match?(/\A\| [^|]+ \| [^|]+ \| .*\d+\.\d+/) }
    refute_nil at, "no row with a figure in the summary"
    lines[at] = lines[at].sub(/(\d+)\.(\d+)/) { "#{Regexp.last_match(1).to_i + 1}.#{Regexp.last_match(2)}" }
    Dir.mktmpdir do |dir|
      copy = File.join(dir, "README.md")
      File.write(copy, lines.join)
      problems = Bench::Summary.readme_problems(File.read(copy), base: ROOT)
      assert_equal 1, problems.size, problems.inspect
      assert_includes problems.first, FIX
      assert_includes problems.first, lines[at].strip
    end
  end

  def test_the_report_renders_every_results_file
    files = Dir[File.join(ROOT, "bench/results/*.json")]
    refute_empty files
    files.each do |file|
      document = JSON.parse(File.read(file), symbolize_names: true)
      report = Bench::Markdown.new(document, source: File.basename(file)).to_s
      document[:results].each do |row|
        assert_includes report, "\n## #{row[:scenario]}\n", "#{file}: #{row[:scenario]}"
        assert report.include?("\n| #{row[:subject]} |") || report.include?("\n### #{row[:subject]}"),
               "#{file}: #{row[:scenario]} #{row[:subject]}"
      end
      assert_includes report, "not recorded" unless document[:command]
    end
  end

  def test_the_summary_picks_the_best_rows_and_their_ratios
    summary = Bench::Summary.new(DOCUMENT, "bench/results/hand.json")
    http, falcon = summary.rows
    # evt: io_uring's 5.0 beats epoll's 6.0; peers: async-uring's 6.25 (blocking's 3.0 is a
    # reference row, carbon failed, uringmachine's 2.0 had errors); C: c-blocking's 3.2 (c-uring's
    # 3.5 had errors); the default, epoll: 6.0 / 5.0 = 1.20 of the best, 6.0 / 6.25 = 0.96 of the peer;
    # 5.0 / 6.25 = 0.80 and 5.0 / 3.2 = 1.56.
    assert_equal %w[c-blocking evt-epoll evt-io_uring async-uring], http.values_at(:c, :default, :evt, :peer).map { |r| r[:subject] }
    assert_equal %w[c-blocking evt-io_uring async-uring], http.values_at(:c, :evt, :peer).map { |r| r[:subject] }
    # falcon: falcon-evt-epoll's 40.0 over falcon-uring's 50.0 (itsi is not Falcon): 0.80; the
    # default, falcon-evt: 45.0 / 40.0 = 1.125, which %.2f prints as 1.12 (1.125 is exact in binary: half to even).
    assert_equal [nil, "falcon-evt", "falcon-evt-epoll", "falcon-uring"],
                 falcon.values_at(:c, :default, :evt, :peer).map { |r| r&.fetch(:subject) }

    text = summary.to_s
    assert_includes text, "| http-keepalive | CPU µs/req | 3.20 | evt-epoll 6.00 | evt-io_uring 5.00 | 1.20 | async-uring 6.25 | 0.96 | 0.80 | 1.56 |\n"
    assert_includes text, "| falcon (hello) | CPU µs/req | — | falcon-evt 45.0 | falcon-evt-epoll 40.0 | 1.12 | falcon-uring 50.0 | 0.90 | 0.80 | — |\n"
    assert_includes text, "`bench/results/hand.json`: Ruby 3.4.5, no YJIT, 2026-11-26, " \
                          "`bin/bench --only http-keepalive,falcon --repeat 3`; medians of 3 runs"
    assert_includes text, "[hand.md](bench/results/hand.md)"
  end

  def test_readme_blocks_name_their_file
    text = "a\n<!-- bench-summary: bench/results/latest.json -->\nold\n<!-- /bench-summary -->\nb\n"
    updated = Bench::Summary.update_readme(text, base: ROOT, only: File.join(ROOT, "bench/results/latest.json"))
    assert updated.start_with?("a\n<!-- bench-summary: bench/results/latest.json -->\n\n| scenario |")
    assert updated.end_with?("\n<!-- /bench-summary -->\nb\n")
    assert_raises(ArgumentError) { Bench::Summary.update_readme(text, base: ROOT, only: "bench/results/rails.json") }
    assert_raises(ArgumentError) { Bench::Summary.update_readme("a\n<!-- bench-summary: x.json -->\n", base: ROOT) }
  end

  private

  def blocks?(text)
    text.each_line.any? { |line| line.match?(Bench::Summary::OPEN) }
  end
end
