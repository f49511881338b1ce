# frozen_string_literal: true

require "test_helper"

# Kernel#sleep and the timer heap.
class SleepTest < Minitest::Test
  def test_sleeping_fibers_overlap
    time = elapsed { evt { 5.times { Fiber.schedule { sleep 0.1 } } } }
    assert_operator time, :>=, 0.1
    assert_operator time, :<, 0.3
  end

  # Never early, on every try. Within 5 ms on at least one of three tries: the ten sleepers wake in
  # one turn, so one try's median is one wakeup, which a busy machine can delay (a late wakeup is
  # the machine's; an early one, or one late every time, is the loop's).
  def test_sleep_is_never_early_and_within_five_milliseconds_at_100ms
    medians = []
    3.times do
      samples = []
      evt do
        10.times do
          Fiber.schedule do
            started = monotonic
            sleep 0.1
            samples << (monotonic - started)
          end
        end
      end
      assert_equal 10, samples.size
      assert_operator samples.min, :>=, 0.1
      medians << median(samples)
      break if medians.last <= 0.105
    end
    assert_operator medians.min, :<=, 0.105, "every try woke late: medians #{medians.map { |m| m.round(4) }}"
  end

  def test_timers_fire_in_deadline_order
    order = []
    evt do
      [0.05, 0.01, 0.03, 0.02, 0.04].each do |delay|
        Fiber.schedule do
          sleep delay
          order << delay
        end
      end
    end
    assert_equal [0.01, 0.02, 0.03, 0.04, 0.05], order
  end

  def test_sleep_zero_lets_the_other_ready_fibers_run
    order = []
    evt do
      %i[a b].each do |name|
        Fiber.schedule do
          3.times do |i|
            order << :"#{name}#{i}"
            sleep 0
          end
        end
      end
    end
    assert_equal %i[a0 b0 a1 b1 a2 b2], order
  end

  def test_sleep_without_duration_lasts_until_unblocked
    woke = false
    evt do
      sleeper = Fiber.schedule do
        sleep
        woke = true
      end
      Fiber.schedule do
        sleep 0.01
        refute woke
        Fiber.scheduler.unblock(nil, sleeper)
      end
    end
    assert woke
  end

  def test_sleep_nil_lasts_until_unblocked
    woke = false
    evt do
      sleeper = Fiber.schedule do
        sleep nil
        woke = true
      end
      Fiber.scheduler.unblock(nil, sleeper)
    end
    assert woke
  end

  def test_negative_sleep_raises_as_without_a_scheduler
    expected = error_without_scheduler { sleep(-1) }
    evt do
      error = assert_raises(expected.class) { sleep(-1) }
      assert_equal expected.message, error.message
    end
  end

  def test_a_sleep_past_the_clock_raises_as_without_a_scheduler
    expected = error_without_scheduler { sleep 1e30 }
    evt do
      error = assert_raises(expected.class) { sleep 1e30 }
      assert_equal expected.message, error.message
    end
  end

  def test_non_numeric_sleep_raises_as_without_a_scheduler
    expected = error_without_scheduler { sleep("1") }
    evt do
      error = assert_raises(expected.class) { sleep("1") }
      assert_equal expected.message, error.message
    end
  end

  def test_sleep_with_too_many_arguments_raises_argument_error
    evt { assert_raises(ArgumentError) { Fiber.scheduler.kernel_sleep(1, 2) } }
  end

  class Stop < StandardError; end

  def test_a_sleeping_fiber_unwound_early_leaves_no_timer_behind
    fired = false
    rescued = false
    raiser_resumed = false
    time = elapsed do
      evt do
        sleeper = Fiber.schedule do
          sleep 5
          fired = true
        rescue Stop
          rescued = true
        end
        Fiber.schedule do
          sleeper.raise(Stop)
          raiser_resumed = true
        end
      end
    end
    refute fired
    assert rescued
    assert raiser_resumed, "the fiber that raised must run on"
    assert_operator time, :<, 2, "a leftover 5 s timer would keep the loop alive"
  end

  # The loop tightens its thread's timer slack (the kernel's leeway on timed waits) while it waits
  # for timers, and gives the thread its own back when the scheduler closes. The main thread's
  # slack is /proc/self/timerslack_ns.
  def test_the_timer_slack_is_tightened_while_the_loop_waits_and_restored_after
    skip "the pure-Ruby loop leaves the timer slack alone" if SELECT
    skip "no /proc/self/timerslack_ns here" unless File.readable?("/proc/self/timerslack_ns")
    skip "not on the main thread" unless Thread.current == Thread.main

    slack = -> { Integer(File.read("/proc/self/timerslack_ns")) }
    before = slack.call
    during = nil
    evt do
      sleep 0.002
      during = slack.call
    end
    assert_equal 1000, during
    assert_equal before, slack.call
  end
end
