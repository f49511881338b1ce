# frozen_string_literal: true

require "test_helper"
require "yaml"

# The GitHub Actions workflow (.github/workflows/ci.yml) cannot run here: it is valid YAML, has the
# jobs the README promises, and runs only commands of the project's that the README documents.
class WorkflowTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  WORKFLOW = File.join(ROOT, ".github/workflows/ci.yml")

  def workflow = YAML.safe_load_file(WORKFLOW, aliases: false)

  # Every shell line of every step, a VM action's included.
  def shell_lines
    workflow.fetch("jobs").values.flat_map do |job|
      job.fetch("steps").flat_map { |step| [step["run"], step.dig("with", "run"), step.dig("with", "prepare")] }
    end.compact.flat_map(&:lines).map(&:strip).reject(&:empty?)
  end

  def test_the_jobs_cover_linux_rubies_and_head_macos_and_freebsd
    jobs = workflow.fetch("jobs")
    assert_equal %w[freebsd linux macos], jobs.keys.sort
    assert_equal ["3.3", "3.4", "4.0", "head"], jobs.dig("linux", "strategy", "matrix", "ruby")
    assert_match(/\Amacos-/, jobs.dig("macos", "runs-on"))
    assert(jobs.dig("freebsd", "steps").any? { |step| step["uses"].to_s.start_with?("vmactions/freebsd-vm@") })
    assert_equal({ "contents" => "read" }, workflow.fetch("permissions"))
  end

  # What the jobs run of the project's (bin/test, rake), less the settings before it, is written
  # in the README as it is run.
  def test_every_command_of_the_project_it_runs_is_in_the_readme
    readme = File.read(File.join(ROOT, "README.md"))
    commands = shell_lines.grep(%r{\bbin/test\b|\brake\b}).map { |line| line.sub(/\A(?:[A-Z_]+=(?:"[^"]*"|\S*)\s+)+/, "") }
    assert_operator commands.size, :>=, 3, commands.inspect
    commands.each { |command| assert readme.include?(command), "the workflow runs `#{command}`, which the README does not document" }
  end

  def test_its_header_says_it_has_not_run_here
    header = File.foreach(WORKFLOW).take_while { |line| line.start_with?("#") }.join
    assert_match(/cannot run here/, header)
  end
end
