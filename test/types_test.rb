# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"

# The type signatures of the public API in sig/ (RBS): they are valid (`rbs -I sig validate`), and
# they say what the real classes take and give: test/types/example.rb, a small program using the API
# as the README does, runs under rbs's runtime type checker (rbs/test/setup), which checks every call
# into Evt's classes (the program's, and the hooks Ruby makes on the scheduler) against sig/. It runs
# on the backend under test: the example inherits EVT_BACKEND and EVT_NO_EXTENSION.
#
# rbs is in the Gemfile's :docs group; bin/setup installs it. Both checks go through Bundler, for the
# version Gemfile.lock names.
class TypesTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  EXAMPLE = File.join(ROOT, "test", "types", "example.rb")
  LIMIT = 30 # seconds: the example takes well under one

  # What the example prints, a line per part (each part checks its own results, and aborts on a wrong
  # one). Evt::Selector runs on the C loop only: the pure-Ruby one has no selector (README, Backends).
  def expected_output
    [
      "api: ok",
      "run: slept at once, ping pong, pipe, queue, timeout, mutex, close",
      "scheduler: process, address_resolve, zlib, yield",
      "insight: stats, fibers, dump, stall reports",
      "select scheduler: hello",
      "workers: served by worker 0, twice",
      EvtTest::SELECT ? "selector: none on the pure-Ruby loop" : "selector: hello",
    ].map { |line| "#{line}\n" }.join
  end

  def setup
    @rbs = rbs_executable
  end

  def test_the_signatures_are_valid
    output, status = run_ruby_in_bundle(@rbs, "-I", "sig", "validate")
    assert status&.success?, "`rbs -I sig validate` failed (#{status.inspect}):\n#{output}"
  end

  def test_the_example_keeps_to_the_signatures_at_run_time
    environment = {
      "RBS_TEST_TARGET" => "Evt::*", # Evt and everything under it that sig/ declares
      "RBS_TEST_OPT" => "-I sig",
      "RBS_TEST_LOGLEVEL" => "error", # quiet, but a call to a method sig/ lacks is still said
      # rbs's documentation asks for this to raise on a type error; rbs 3.x raises regardless
      # (RBS::Test::Tester::TypeError, an Exception).
      "RBS_TEST_RAISE" => "true",
    }
    output, errors, status = run_ruby_in_bundle("-rrbs/test/setup", EXAMPLE, env: environment, separate: true)
    assert status&.success?, "the example failed under rbs's type checker (#{status.inspect}):\n#{output}#{errors}"
    assert_equal "", errors, "the example wrote to stderr (a type error in a fiber or a worker is reported there)"
    assert_equal expected_output, output
  end

  private

  def rbs_executable = EvtTest.locked_gem_executable("rbs")

  # Runs this Ruby with evt's lib and Bundler set up (the project's Gemfile) in the project's root,
  # in a process group of its own that is killed after LIMIT seconds. [stdout with stderr, status],
  # or with +separate+ [stdout, stderr, status]; status nil when it was killed.
  def run_ruby_in_bundle(*arguments, env: {}, separate: false)
    environment = { "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile") }.merge(env)
    command = [RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-rbundler/setup", *arguments]
    Open3.popen3(environment, *command, chdir: ROOT, pgroup: true) do |stdin, stdout, stderr, waiter|
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      status = waiter.join(LIMIT) && waiter.value
      unless status
        Process.kill(:KILL, -waiter.pid) # the example's worker process too
        waiter.join
      end
      separate ? [out.value, err.value, status] : [out.value + err.value, status]
    end
  end
end
