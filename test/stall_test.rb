# frozen_string_literal: true

require "test_helper"
require "json"

# Stall reports: a fiber (or the thread's own code) that holds the thread past the threshold
# without returning to the loop is reported while it goes on, and once more when it ends.
class StallTest < Minitest::Test
  def watch_threads = Thread.list.count { |thread| thread.name == "evt stall watch" && thread.alive? }

  # Runs the block's fibers on a scheduler made with `options`; the reports it got.
  def reports_of(**options)
    reports = [] # appended to by the watch's thread (under the GVL)
    scheduler = Evt::Scheduler.new(**options, on_stall: ->(report) { reports << report })
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      yield reports
    ensure
      Fiber.set_scheduler(nil)
    end
    reports.dup
  end

  # Spins without returning to the loop until an :ongoing report has come (or `limit` seconds):
  # an :ended one may come first, for a shorter stall before (a slow start under a loaded machine).
  def spin_until_reported(reports, limit = 10)
    deadline = monotonic + limit
    nil until reports.any? { |report| report.state == :ongoing } || monotonic > deadline
  end

  def test_a_spinning_fiber_is_reported_while_it_spins_and_when_it_ends
    spun = nil
    reports = reports_of(stall: 0.1) do |so_far|
      Fiber.schedule { sleep 0.5 } # a fiber the spin holds up
      Fiber.schedule { spun = elapsed { spin_until_reported(so_far) } }
    end
    ongoing, ended = reports.partition { |report| report.state == :ongoing }
    refute_empty ongoing, "no report while the fiber spun (#{spun.round(3)} s)"
    assert_operator spun, :<, 10, "the spin saw no report in 10 s"
    first = ongoing.first
    assert_operator first.duration, :>=, 0.1
    assert first.backtrace.any? { |frame| frame.include?("spin_until_reported") }, first.backtrace.join("\n")
    assert_operator first.samples, :>=, 1
    spin_ended = ended.select { |report| report.fiber.equal?(first.fiber) }
    assert_equal 1, spin_ended.size, reports.join("\n")
    assert_operator spin_ended.first.duration, :>=, spun * 0.9
    refute first.fiber.blocking?
    assert_match(/\Aevt: stall ongoing: .* held .* for [\d.]+ s \(\d+ samples\) at .*spin_until_reported/, first.to_s)
  end

  def test_the_threads_own_code_between_turns_is_reported_too
    reports = reports_of(stall: 0.1) do |so_far|
      Fiber.schedule { sleep 0.2 } # waits while the thread's own code spins
      spin_until_reported(so_far)
      Fiber.scheduler.run
    end
    refute_empty reports
    assert reports.first.fiber.blocking?, "the holder is the thread's own (blocking) fiber"
  end

  def test_no_report_below_the_threshold
    reports = reports_of(stall: 0.5) do
      3.times do
        Fiber.schedule do
          5.times do
            finish = monotonic + 0.02
            nil while monotonic < finish
            sleep 0.01
          end
        end
      end
    end
    assert_empty reports
  end

  def test_off_by_default_no_thread_and_no_report
    skip "EVT_STALL is set in this environment" if ENV["EVT_STALL"]
    before = watch_threads
    scheduler = Evt::Scheduler.new
    assert_equal before, watch_threads
    assert_nil scheduler.send(:stall_state).first
    evt do
      Fiber.schedule { sleep 0.05 }
      finish = monotonic + 0.2
      nil while monotonic < finish
    end
    scheduler.close
  end

  def test_the_watch_thread_ends_with_the_scheduler
    before = watch_threads
    reports_of(stall: 0.05) do
      assert_equal before + 1, watch_threads
      Fiber.schedule { sleep 0.01 }
    end
    assert_equal before, watch_threads
  end

  def test_bad_thresholds_are_refused
    assert_raises(ArgumentError) { Evt::Scheduler.new(stall: 0) }
    assert_raises(ArgumentError) { Evt::Scheduler.new(stall: -1) }
    assert_raises(ArgumentError) { Evt::Scheduler.new(stall: "0.1") }
  end

  def test_a_scheduler_in_another_thread_is_watched_too
    reports = nil
    Thread.new do
      reports = reports_of(stall: 0.1) do |so_far|
        Fiber.schedule { sleep 0.3 }
        Fiber.schedule { spin_until_reported(so_far) }
      end
    end.join(30)
    refute_empty reports.select { |report| report.state == :ongoing }
  end

  SCRIPT = <<~RUBY
    require "evt"
    def spin_in_the_script(seconds)
      finish = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < finish
    end
    Evt.run do
      Fiber.schedule { sleep 0.1 }
      Fiber.schedule { spin_in_the_script(0.6) }
    end
  RUBY

  def test_evt_stall_reports_on_stderr_a_line_each
    output, status = with_env("EVT_STALL" => "100", "EVT_STALL_FORMAT" => nil) { run_ruby(SCRIPT, limit: 30) }
    assert status&.success?, output
    lines = output.lines.grep(/\Aevt: stall/)
    assert_operator lines.size, :>=, 2, output
    assert_match(/\Aevt: stall ended: .* for 0\.[5-9]\d* s/, lines.last)
    assert lines.any? { |line| line.include?("spin_in_the_script") }, output
  end

  def test_evt_stall_format_json_gives_a_json_object_a_line
    output, status = with_env("EVT_STALL" => "100", "EVT_STALL_FORMAT" => "json") { run_ruby(SCRIPT, limit: 30) }
    assert status&.success?, output
    records = output.lines.grep(/\A\{/).map { |line| JSON.parse(line) }
    refute_empty records, output
    assert_equal %w[ended], records.map { |record| record["state"] }.uniq - %w[ongoing]
    assert_equal "stall", records.first["event"]
    assert_kind_of Float, records.last["duration"]
  end

  def test_evt_stall_must_be_milliseconds
    output, status = with_env("EVT_STALL" => "soon") { run_ruby('require "evt"; Evt.run { }', limit: 30) }
    refute status&.success?
    assert_match(/EVT_STALL must be a number of milliseconds > 0, not "soon"/, output)
  end

  def with_env(values)
    saved = values.keys.to_h { |key| [key, ENV.fetch(key, nil)] }
    values.each { |key, value| ENV[key] = value }
    yield
  ensure
    saved.each { |key, value| ENV[key] = value }
  end
end
