# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"
require "tmpdir"

# The API documentation, as YARD builds it from .yardopts (lib/ and ext/evt/selector.c):
# - every class, module, constant, attribute and public method has a docstring: `yard stats
#   --list-undoc` lists nothing and says 100.00% documented;
# - YARD warns of nothing while it parses and renders (an unknown tag, a @param naming no
#   parameter, a {link} to nothing, a mixin it cannot place);
# - what the classes define at run time is documented, C extension included. YARD reads no C file
#   but selector.c: Evt::Loop's methods (evt.c, io.c, hooks.c) are documented in lib/evt.rb's
#   @!parse block, the modules close.c and blocking.c define in @!parse blocks of their own. A
#   method the extension gains without its documentation, or documentation left for a method
#   Evt::Loop no longer has, fails here.
#
# The documentation is built once per process into a temporary directory (registry and HTML), so
# the checkout is left as it was; it takes a few seconds. yard is in the Gemfile's :docs group,
# which bin/setup installs; without it the tests fail, saying so. It runs through Bundler, for the
# version Gemfile.lock names.
class YardTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  LIMIT = 120 # seconds for one yard command

  # What the build printed: yard doc's output (with any warning), yard stats --list-undoc's, and
  # the paths of the objects YARD knows, private ones included (yard list --private: YARD takes the
  # constants after a `private` for private ones, which Ruby does not).
  Build = Struct.new(:doc, :stats, :paths, keyword_init: true)

  # The singleton methods Ruby gives every Struct class.
  STRUCT_METHODS = %i[[] inspect keyword_init? members new].freeze

  class << self
    attr_accessor :built
  end

  def test_every_object_is_documented
    stats = build.stats
    undocumented = stats[/^Undocumented Objects:\n(.*)/m, 1]
    assert undocumented.nil?, "yard stats --list-undoc lists undocumented objects (document each; an " \
                              "internal one with @api private and a line saying what it is for):\n" \
                              "#{undocumented}"
    assert_match(/^ ?100\.00% documented$/, stats, "yard stats does not say 100.00% documented")
  end

  def test_yard_warns_of_nothing
    warnings = build.doc.lines.grep(/\[(warn|error)\]/)
    assert warnings.empty?, "yard doc warned; its whole output:\n#{build.doc}"
  end

  def test_the_documentation_matches_what_the_classes_define_at_run_time
    runtime = runtime_api
    missing = runtime - build.paths
    assert_empty missing, "public at run time, missing from the documentation (Evt::Loop's go in " \
                          "lib/evt.rb's @!parse block, the other C modules' in theirs)"
    return unless Evt.extension? # else Evt::Loop is the pure-Ruby loop, documented from its source

    stale = build.paths.grep(/\AEvt::Loop(#|\.|::)/) - ["Evt::Loop#initialize"] - runtime
    assert_empty stale, "documented in lib/evt.rb's @!parse block, not defined by the extension's Evt::Loop"
  end

  private

  def build
    self.class.built ||= build_documentation
  end

  # Builds the documentation into a temporary directory, removed when the tests are over.
  def build_documentation
    yard = yard_executable
    dir = Dir.mktmpdir("evt-yard")
    Minitest.after_run { FileUtils.rm_rf(dir) }
    database = File.join(dir, "yardoc")
    doc = run_yard(yard, "doc", "--db", database, "--output-dir", File.join(dir, "html"), "--no-progress")
    stats = run_yard(yard, "stats", "--list-undoc", "--use-cache", "--db", database)
    list = run_yard(yard, "list", "--private", "--use-cache", "--db", database)
    Build.new(doc: doc, stats: stats, paths: list.lines.map { |line| line.chomp.split(": ").last })
  end

  def yard_executable = EvtTest.locked_gem_executable("yard")

  # Runs yard with this Ruby and Bundler in the project's root: its output (stdout and stderr).
  # Fails when yard exits non-zero or is still running after LIMIT seconds.
  def run_yard(yard, *arguments)
    # The lockfile named too: under `bundle exec`, Bundler 4 exports BUNDLE_LOCKFILE.
    environment = { "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile"),
                    "BUNDLE_LOCKFILE" => File.join(ROOT, "Gemfile.lock") }
    command = [RbConfig.ruby, "-rbundler/setup", yard, *arguments]
    Open3.popen2e(environment, *command, chdir: ROOT, pgroup: true) do |stdin, output, waiter|
      stdin.close
      reader = Thread.new { output.read }
      status = waiter.join(LIMIT) && waiter.value
      unless status
        Process.kill(:KILL, -waiter.pid)
        waiter.join
      end
      text = reader.value
      assert status&.success?, "`yard #{arguments.join(" ")}` failed (#{status.inspect}):\n#{text}"
      text
    end
  end

  # The public methods and constants of Evt and of every module under it, as Ruby has them now:
  # "Evt::Loop#run", "Evt::Loop.backends", "Evt::Loop::FIBER_SCHEDULER_VERSION", "Evt::Workers"...
  def runtime_api(namespace = Evt, seen = {})
    return [] if seen[namespace]

    seen[namespace] = true
    singletons = namespace.singleton_methods(false)
    singletons -= STRUCT_METHODS if namespace.is_a?(Class) && namespace < Struct
    api = namespace.public_instance_methods(false).map { |name| "#{namespace.name}##{name}" } +
          singletons.map { |name| "#{namespace.name}.#{name}" }
    namespace.constants(false).sort.each do |name|
      value = namespace.const_get(name) # loads what is autoloaded
      if !value.is_a?(Module)
        api << "#{namespace.name}::#{name}"
      elsif value.name == "#{namespace.name}::#{name}" # not another name for a module elsewhere
        api << value.name
        api.concat(runtime_api(value, seen))
      end
    end
    api
  end
end
