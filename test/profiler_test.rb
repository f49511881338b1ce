# frozen_string_literal: true

require "test_helper"
require "tempfile"

# fiber-profiler (async's stall profiler, 0.7) under evt: its watchdog and capture modes report a
# fiber that holds the thread, as they do under Async. Skipped, saying so, where the gem is not
# installed (bin/setup installs it: the Gemfile's :profiler group).
class ProfilerTest < Minitest::Test
  def setup
    require "fiber/profiler"
    require "fiber/profiler/watchdog"
  rescue LoadError => e
    skip "fiber-profiler is not installed (#{e.message}): bin/setup installs it"
  end

  def spin_for(seconds)
    finish = monotonic + seconds
    nil while monotonic < finish
  end

  # Runs two fibers on a scheduler with `profiler`: one sleeps, one spins `seconds`.
  def run_spinning(profiler, seconds)
    scheduler = Evt::Scheduler.new(profiler: profiler)
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule { sleep 0.05 }
      Fiber.schedule { spin_for(seconds) }
    ensure
      Fiber.set_scheduler(nil)
    end
  end

  def test_the_watchdog_reports_a_spinning_fiber_while_it_spins
    output = Tempfile.create("watchdog")
    watchdog = Fiber::Profiler::Watchdog.new(stall_threshold: 0.2, sample_interval: 0.05, output: output)
    run_spinning(watchdog, 0.8)
    output.rewind
    reports = output.read.lines.map { |line| JSON.parse(line) }
    refute_empty reports, "the watchdog reported nothing"
    assert_equal "watchdog", reports.first["mode"]
    assert reports.first["samples"].any? { |sample| sample["backtrace"].any? { |frame| frame.include?("spin_for") } },
           reports.first.inspect
    assert_operator reports.first["duration"], :<, 0.8, "reported while the fiber still spun"
  ensure
    output&.close
  end

  def test_the_capture_mode_reports_a_stall_once_it_ends
    output = Tempfile.create("capture")
    capture = Fiber::Profiler::Capture.new(stall_threshold: 0.1, track_calls: false, output: output)
    run_spinning(capture, 0.3)
    assert_operator capture.stalls, :>=, 1
    output.rewind
    record = output.read.lines.map { |line| JSON.parse(line) }.find { |line| line["duration"].to_f >= 0.3 }
    refute_nil record, "no stall of 0.3 s reported"
  ensure
    output&.close
  end

  def test_fiber_profiler_watchdog_from_the_environment_as_under_async
    script = <<~RUBY
      require "evt"
      Evt.run do
        Fiber.schedule { sleep 0.05 }
        finish = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.8
        nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < finish
      end
    RUBY
    env = { "FIBER_PROFILER" => "watchdog", "FIBER_PROFILER_WATCHDOG_STALL_THRESHOLD" => "0.2",
            "FIBER_PROFILER_WATCHDOG_SAMPLE_INTERVAL" => "0.05" }
    output, status = IO.popen(env, [RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", script],
                              err: %i[child out], &:read).then { |text| [text, $?] }
    assert status.success?, output
    assert_includes output, '"mode":"watchdog"'
  end
end
