# frozen_string_literal: true

require "test_helper"
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
