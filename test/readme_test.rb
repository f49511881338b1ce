# frozen_string_literal: true

require "test_helper"
require "json"
require "open3"
require "rbconfig"

# Every ```ruby example of the README runs, as a newcomer would paste it: in a Ruby process of its
# own, with this checkout's lib/ and the backend of the run (EVT_BACKEND, EVT_NO_EXTENSION inherited).
# It must end well within a timeout, exit 0, and print each `# => value` it promises, in order (the
# value is the comment's text up to a colon; what follows the colon is commentary).
class ReadmeTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  TIMEOUT = 60
  # async's gems are the peers' (test/peers/Gemfile, installed by bin/setup beside the peers' suites).
  PEERS_GEMFILE = File.join(ROOT, "test/peers/Gemfile")
  PEERS_GEMS = File.join(ENV.fetch("XDG_CACHE_HOME", File.join(Dir.home, ".cache")), "evt", "peers")

  def self.examples
    File.read(File.join(ROOT, "README.md")).scan(/^```ruby\n(.*?)^```$/m).map(&:first)
  end

  def self.expected_lines(code)
    code.lines.filter_map { |line| line[/#\s*=>\s*([^:\n]*)/, 1]&.strip }
  end

  def test_the_readme_has_examples
    assert_operator self.class.examples.size, :>=, 5, "the README's ```ruby examples were not found"
  end

  def test_expected_values_are_read_from_the_comments
    assert_equal ["true", "ok ok"], self.class.expected_lines("puts x # => true: because\nputs y # => ok ok\n")
  end

  # Every page of docs/ is linked from the README, and every relative link of the README and docs/
  # names a file that exists.
  def test_the_docs_pages_are_linked_and_links_resolve
    readme = File.read(File.join(ROOT, "README.md"))
    Dir[File.join(ROOT, "docs/*.md")].each do |page|
      assert_includes readme, "(docs/#{File.basename(page)}", "the README does not link #{File.basename(page)}"
    end
    [File.join(ROOT, "README.md"), *Dir[File.join(ROOT, "docs/*.md")]].each do |file|
      File.read(file).scan(/\]\(([^)#:]+)(?:#[^)]*)?\)/).flatten.each do |target|
        assert File.exist?(File.expand_path(target, File.dirname(file))), "#{file} links #{target}, which does not exist"
      end
    end
  end

  DOC_FILES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/*.md"].freeze
  # Where a path in a code span starts, for it to be checked as one of this repository's.
  TOP = %w[lib ext test bench bin docs sig apps].freeze
  # Paths the docs name in other projects' trees: Ruby's scheduler tests, a file of io-event's.
  FOREIGN = %w[test/fiber lib/io/event/native.rb].freeze

  def doc_files
    DOC_FILES.flat_map { |glob| Dir[File.join(ROOT, glob)] }
  end

  # GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -.
  def anchors(file)
    File.read(file).scan(/^#+ (.+)$/).map { |(title)| title.strip.downcase.gsub(/[^\p{Word}\- ]/, "").tr(" ", "-") }
  end

  # A link's #anchor names a heading of the page it points at (the same page when it has no path).
  def test_every_anchor_names_a_heading
    doc_files.each do |file|
      File.read(file).scan(/\]\(([^)\s:]*)#([^)\s]+)\)/).each do |target, anchor|
        page = target.empty? ? file : File.expand_path(target, File.dirname(file))
        next unless page.end_with?(".md") && File.exist?(page)

        assert_includes anchors(page), anchor, "#{file} links #{target}##{anchor}: no such heading in #{File.basename(page)}"
      end
    end
  end

  # Every EVT_ variable evt's code reads is in the README's table, or in docs/testing.md's for those
  # the README sends there; every one the README sends there is in that table.
  def test_every_environment_variable_is_described
    readme = File.read(File.join(ROOT, "README.md"))
    testing = File.read(File.join(ROOT, "docs/testing.md"))
    table = ->(text) { text.scan(/^\| ((?:`[A-Z_]+`(?:, )?)+) \|/).flatten.flat_map { |cell| cell.scan(/`([A-Z_]+)`/).flatten } }
    sent = readme.lines.grep(/docs\/testing\.md/).grep(/\A\| `/).flat_map { |line| line.split(" | ").first.scan(/`([A-Z_]+)`/).flatten }
    refute_empty sent
    assert_empty sent - table.call(testing), "the README sends these to docs/testing.md, whose table lacks them"
    code = Dir[File.join(ROOT, "{lib/**/*.rb,ext/evt/*.{c,rb}}")].flat_map do |file|
      File.read(file).scan(/(?:ENV(?:\.fetch)?[\[(]"|ENV\.key\?\("|getenv\(")(EVT_[A-Z_]+)/).flatten
    end
    refute_empty code
    assert_empty code.uniq - table.call(readme) - table.call(testing), "read by evt's code, described nowhere"
  end

  # The gem's pages (README, CHANGELOG, docs/) link only files the gem ships.
  def test_the_gems_pages_link_files_it_ships
    files = Dir.chdir(ROOT) { Gem::Specification.load(File.join(ROOT, "evt.gemspec")).files }
    pages = files.grep(/\.md\z/).reject { |f| f.start_with?("bench/") }
    refute_empty pages
    missing = pages.flat_map do |page|
      File.read(File.join(ROOT, page)).scan(/\]\(([^)#:\s]+)(?:#[^)]*)?\)/).flatten.filter_map do |link|
        path = File.expand_path(link, File.join(ROOT, File.dirname(page))).delete_prefix("#{ROOT}/")
        next if files.include?(path) || files.any? { |f| f.start_with?("#{path.chomp("/")}/") }

        "#{page} links #{link}, which the gem does not ship"
      end
    end
    assert_empty missing, missing.join("\n")
  end

  # Relative links stay inside the repository (the gem and a clone have nothing outside it).
  def test_no_link_leaves_the_repository
    doc_files.each do |file|
      File.read(file).scan(/\]\(([^)#:\s]+)(?:#[^)]*)?\)/).flatten.each do |target|
        path = File.expand_path(target, File.dirname(file))
        assert path.start_with?("#{ROOT}/"), "#{file} links #{target}, outside the repository"
      end
    end
  end

  # A path in a code span (`bench/reference/c_epoll_server.c`) names a file or directory that
  # exists; spans with a placeholder (<x>, *, {a,b}) are patterns, not paths, and FOREIGN are others'.
  def test_code_span_paths_exist
    missing = doc_files.flat_map do |file|
      File.read(file).scan(/`([^`\s]+)`/).flatten.filter_map do |span|
        path = span.sub(/:\d+(-\d+)?\z/, "").sub(%r{/\z}, "")
        next unless TOP.include?(path.split("/").first) && path.include?("/")
        next if path.match?(/[<>*{}$]/) || FOREIGN.include?(path)

        "#{file.delete_prefix("#{ROOT}/")} names `#{span}`, which does not exist" unless File.exist?(File.join(ROOT, path))
      end
    end
    assert_empty missing, missing.join("\n")
  end

  # A result file the docs cite records where it came from: its JSON (or, with no JSON, its report)
  # names the commit and the command. The README's summaries come from three runs or more of the
  # commit's code: a clean tree, or one whose recorded changes touch nothing bin/bench runs.
  # What a bin/bench run loads: a change to any of it makes the run another code's.
  BENCH_RUNS = %r{\A(lib|ext|bench|apps|bin)/|\A(Gemfile|Gemfile\.lock|Rakefile|evt\.gemspec)\z}

  def test_cited_results_record_their_commit_and_command
    cited = doc_files.flat_map { |file| File.read(file).scan(%r{bench/results/([\w.-]+)\.(?:md|json|svg)}).flatten }.uniq
    assert_operator cited.size, :>=, 3
    unknown = cited.filter_map do |name|
      json = File.join(ROOT, "bench/results/#{name}.json")
      if File.exist?(json)
        record = JSON.parse(File.read(json))
        "#{name}.json records no commit or command" unless record.dig("git", "commit") && record["command"]
      else
        report = File.read(File.join(ROOT, "bench/results/#{name}.md"))
        "#{name}.md names no commit or command" unless report.match?(/^\| commit \|/) && report.match?(/^\| command \|/)
      end
    end
    assert_empty unknown, unknown.join("\n")

    summaries = File.read(File.join(ROOT, "README.md")).scan(/<!-- bench-summary: (\S+) -->/).flatten
    refute_empty summaries
    summaries.each do |path|
      record = JSON.parse(File.read(File.join(ROOT, path)))
      changes = record.dig("git", "dirty") == false ? [] : record.dig("git", "changes")
      refute_nil changes, "#{path}: the README's summaries come from a clean tree, or one whose changes are recorded"
      assert_empty changes.select { |change| BENCH_RUNS.match?(change) },
                   "#{path}: the README's summaries come from the commit's code, not changes to what bin/bench runs"
      assert_match(/--repeat ([3-9]|\d\d)/, record["command"].to_s, "#{path}: the README's summaries are medians of 3 runs or more")
    end
  end

  # docs/deploying.md's claims about the code: the order of the Linux backends (evt.c's table, the
  # order availables keeps) and the size of io_uring's completion queue (backend_uring.c).
  def test_deploying_states_the_backend_order_and_the_ring_size
    deploying = File.read(File.join(ROOT, "docs/deploying.md")).gsub(/\s+/, " ")
    stated = deploying[/the order of `availables` on Linux stays ([\w, ]+):/, 1]
    refute_nil stated, "docs/deploying.md no longer states the order of the backends"
    table = File.read(File.join(ROOT, "ext/evt/evt.c"))[/evt_backends\[\] = \{(.*?)\};/m, 1]
    order = table.scan(/&evt_backend_(\w+)/).flatten.uniq.map { |name| name == "uring" ? "io_uring" : name } - ["kqueue"]
    assert_equal order, stated.split(", ").map(&:strip)
    entries = File.read(File.join(ROOT, "ext/evt/backend_uring.c"))[/^#define COMPLETION_ENTRIES (\d+)/, 1]
    assert_includes deploying, "completion queue (#{Integer(entries).to_s.reverse.scan(/\d{1,3}/).join(",").reverse} entries"
  end

  # Where the docs list backends (three or more names on a line, no platform named within two lines),
  # they list every one the code has (ext/evt/backend_*.c).
  def test_backend_lists_are_whole
    backends = Dir[File.join(ROOT, "ext/evt/backend_*.c")].map { |f| File.basename(f, ".c").delete_prefix("backend_") }
    backends = backends.map { |name| name == "uring" ? "io_uring" : name }
    assert_operator backends.size, :>=, 5
    files = doc_files + Dir[File.join(ROOT, "{lib,sig}/**/*.{rb,rbs}")] + [File.join(ROOT, "evt.gemspec")]
    names = ->(text) { backends.select { |name| text.match?(/(?<![\w-])#{name}(?![\w-])/) } }
    partial = files.flat_map do |file|
      lines = File.readlines(file)
      lines.each_with_index.filter_map do |line, i|
        next if names.call(line).size < 3

        # A list may run over the lines around it, and a platform named there explains a short one.
        around = lines[[i - 2, 0].max..(i + 2)].join
        named = names.call(around)
        next if named.size == backends.size || around.match?(/Linux|macOS|BSD|Windows|Darwin/)

        "#{file.delete_prefix("#{ROOT}/")}:#{i + 1} lists backends without #{(backends - named).join(", ")}: #{line.strip}"
      end
    end
    assert_empty partial, partial.join("\n")
  end

  examples.each_with_index do |code, index|
    first = code.lines.find { |line| !line.start_with?("require") && !line.strip.empty? }.to_s.strip
    define_method("test_example_#{index + 1}_runs: #{first[0, 50]}") { run_example(code) }
  end

  private

  # Outside evt's own bundle (bin/test runs under `bundle exec`, whose variables would point the
  # child's Bundler at evt's Gemfile.lock and rewrite it): the peers' bundle alone, frozen.
  def peers_env
    env = ENV.keys.grep(/\ABUNDLE_|\ARUBYOPT\z/).to_h { |key| [key, nil] }
    env.merge("BUNDLE_GEMFILE" => PEERS_GEMFILE, "BUNDLE_PATH" => PEERS_GEMS, "BUNDLE_FROZEN" => "true")
  end

  def run_example(code)
    env = {}
    ruby = [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}"]
    if code.include?('require "async"')
      skip "async's selector needs the C extension (the pure-Ruby loop has none)" unless Evt.extension?
      env = peers_env
      check, status = Open3.capture2e(env, RbConfig.ruby, "-S", "bundle", "check")
      skip "async is not installed (bin/setup installs it with the peers' suites): #{check.lines.last}" unless status.success?
      ruby << "-rbundler/setup"
    end
    out, status = Open3.popen2e(env, *ruby, "-W:no-experimental", "-e", code, chdir: Dir.tmpdir) do |stdin, output, waiter|
      stdin.close
      reader = Thread.new { output.read }
      unless waiter.join(TIMEOUT)
        Process.kill(:KILL, waiter.pid)
        flunk "the example did not end within #{TIMEOUT} s:\n#{code}"
      end
      [reader.value, waiter.value]
    end
    assert status.success?, "the example failed (#{status}):\n#{code}\noutput:\n#{out}"
    printed = out.lines.map(&:strip)
    self.class.expected_lines(code).each do |value|
      at = printed.index(value)
      refute_nil at, "the example promises #{value.inspect}, its output was:\n#{out}"
      printed = printed.drop(at + 1)
    end
  end
end
