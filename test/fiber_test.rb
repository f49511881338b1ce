# frozen_string_literal: true

require "test_helper"

# Fiber.schedule: starting fibers, nesting, many fibers, and what happens when one fails.
class FiberTest < Minitest::Test
  def test_schedule_runs_the_block_at_once_until_it_waits
    order = []
    evt do
      Fiber.schedule do
        order << :fiber
        sleep 0.01
        order << :fiber_again
      end
      order << :caller
    end
    assert_equal %i[fiber caller fiber_again], order
  end

  def test_schedule_returns_a_non_blocking_fiber
    fiber = nil
    evt { fiber = Fiber.schedule { sleep 0.001 } }
    assert_kind_of Fiber, fiber
    refute fiber.blocking?
    refute fiber.alive?
  end

  def test_a_fiber_scheduling_a_fiber_resumes_after_the_child_waits
    order = []
    evt do
      Fiber.schedule do
        order << :parent
        Fiber.schedule do
          order << :child
          sleep 0.01
          order << :child_again
        end
        order << :parent_again
      end
    end
    assert_equal %i[parent child parent_again child_again], order
  end

  def test_ten_thousand_concurrent_fibers
    finished = 0
    time = elapsed do
      evt do
        10_000.times do
          Fiber.schedule do
            sleep 0.05
            finished += 1
          end
        end
      end
    end
    assert_equal 10_000, finished
    assert_operator time, :<, 10, "the sleeps must overlap"
  end

  def test_an_exception_ends_only_its_fiber_and_is_reported
    other = false
    _, err = capture_io do
      evt do
        Fiber.schedule { raise ArgumentError, "boom" }
        Fiber.schedule do
          sleep 0.01
          other = true
        end
      end
    end
    assert other
    assert_match(/terminated with exception \(report_on_exception is true\)/, err)
    assert_match(/boom \(ArgumentError\)/, err)
    assert_match(/fiber_test\.rb:\d+/, err)
  end

  # Scheduled by the thread's own (blocking) code, a fiber is that code's work, as the block of
  # Evt.run is: its exception must not vanish. It comes out where the thread drives the loop, as
  # with Ruby's reference scheduler (Ruby's test_broken_unblock and test_broken_sleep).
  def test_an_exception_in_a_fiber_the_thread_scheduled_ends_the_thread
    thread = Thread.new do
      Thread.current.report_on_exception = false
      scheduler = Evt::Scheduler.new
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        sleep 0.01
        raise ArgumentError, "late"
      end
      scheduler.run
      :not_raised
    ensure
      scheduler&.close
    end
    error = assert_raises(ArgumentError) { thread.join }
    assert_equal "late", error.message
  end

  def test_an_exception_before_the_first_wait_comes_out_of_fiber_schedule
    outcome = Thread.new do
      Fiber.set_scheduler(Evt::Scheduler.new)
      Fiber.schedule { raise KeyError, "at once" }
      :not_raised
    rescue KeyError => e
      e.message
    end.value
    assert_equal "at once", outcome
  end

  # The thread ends with that exception; closing its scheduler still runs the other fibers.
  def test_the_other_fibers_finish_when_the_thread_ends_with_a_fiber_s_exception
    finished = false
    thread = Thread.new do
      Thread.current.report_on_exception = false
      Fiber.set_scheduler(Evt::Scheduler.new)
      Fiber.schedule do
        sleep 0.02
        finished = true
      end
      Fiber.schedule { raise "boom" }
    end
    assert_raises(RuntimeError) { thread.join }
    assert finished
  end

  # Closing the scheduler of a thread that ends with an exception, the loop meets an error of its
  # own and rescues it (select(2) on a descriptor closed under its IO, by IO.for_fd's twin, which
  # docs/behaviour.md says leaves the waiters on the original alone): the thread's exception is kept
  # all the same, for Thread#join to raise.
  def test_an_error_the_loop_rescues_at_close_keeps_the_thread_s_exception
    outcome = :never_ended
    thread = Thread.new do
      Thread.current.report_on_exception = false
      Fiber.set_scheduler(Evt::Scheduler.new)
      r, = IO.pipe
      Fiber.schedule do
        outcome = r.wait_readable(1) # woken (select, poll, io_uring meet EBADF) or timed out (epoll)
      rescue IOError, SystemCallError => e
        outcome = e
      end
      r.autoclose = false # its number may be another file's by the time r is collected
      IO.for_fd(r.fileno, autoclose: true).close # r's descriptor, closed under it
      raise ArgumentError, "the thread's own"
    end
    error = assert_raises(ArgumentError) { thread.join(10) }
    assert_equal "the thread's own", error.message
    refute_equal :never_ended, outcome, "the fiber waiting on the closed descriptor did not end"
  end

  def test_report_on_exception_false_keeps_quiet
    _, err = capture_io do
      Thread.current.report_on_exception = false
      evt { Fiber.schedule { raise "quiet" } }
    ensure
      Thread.current.report_on_exception = true
    end
    assert_empty err
  end

  def test_exit_in_a_fiber_reaches_the_caller
    error = assert_raises(SystemExit) { evt { Fiber.schedule { exit 3 } } }
    assert_equal 3, error.status
  end

  def test_exit_in_a_fiber_ends_the_other_fibers_through_their_ensure
    cleaned = false
    assert_raises(SystemExit) do
      evt do
        Fiber.schedule do
          sleep 10
        ensure
          cleaned = true
        end
        Fiber.schedule { exit 1 }
      end
    end
    assert cleaned
  end

  def test_schedule_without_a_block_raises_argument_error
    evt { assert_raises(ArgumentError) { Fiber.schedule } }
  end

  def test_a_blocking_scheduled_fiber_is_refused
    evt do
      error = assert_raises(ArgumentError) { Fiber.schedule(blocking: true) { nil } }
      assert_match(/non-blocking/, error.message)
    end
  end

  def test_fiber_options_reach_the_fiber
    seen = nil
    evt { Fiber.schedule(storage: {answer: 42}) { seen = Fiber[:answer] } }
    assert_equal 42, seen
  end

  # On the C loop Fiber.schedule makes the block's Proc and environment (Ruby makes those) and the
  # Fiber, nothing of evt's own: a fiber's objects are GC work for as long as it waits.
  def test_schedule_makes_no_object_of_its_own_on_the_c_loop
    skip "the pure-Ruby loop keeps a few objects per fiber" if SELECT
    made = nil
    evt do
      GC.disable
      before = GC.stat(:total_allocated_objects)
      1000.times { Fiber.schedule { nil } }
      made = (GC.stat(:total_allocated_objects) - before) / 1000.0
    ensure
      GC.enable
    end
    # 3, and a few over the thousand fibers as the loop's own arrays grow
    assert_operator made, :<, 3.1, "objects made per Fiber.schedule (Proc, its environment, Fiber)"
  end

  def test_a_positional_argument_to_schedule_raises_argument_error
    evt { assert_raises(ArgumentError) { Fiber.schedule(1) { nil } } }
  end

  def test_fiber_kill_runs_ensure_and_leaves_the_loop_consistent
    cleaned = false
    after = false
    evt do
      sleeper = Fiber.schedule do
        sleep 10
      ensure
        cleaned = true
      end
      Fiber.schedule do
        sleeper.kill
        sleep 0.01
        after = true
      end
    end
    assert cleaned
    assert after
  end

  def test_schedule_from_a_blocking_block_inside_a_fiber
    assert_equal %i[outer inner other], schedule_inside { |inner| Fiber.blocking(&inner) }
  end

  def test_schedule_from_a_blocking_fiber_resumed_inside_a_fiber
    assert_equal %i[outer inner other], schedule_inside { |inner| Fiber.new(blocking: true, &inner).resume }
  end

  def test_a_fiber_that_raised_into_another_and_then_died_is_not_resumed
    error = assert_raises(SystemExit) do
      evt do
        target = Fiber.schedule do
          sleep 1
        rescue RuntimeError
          exit 3
        end
        Fiber.schedule do
          target.raise("boom")
          sleep 0.01
        end
      end
    end
    assert_equal 3, error.status
  end

  private

  # A scheduled fiber schedules another from inside a blocking context given by the block; the
  # order the three fibers finish in.
  def schedule_inside
    out = []
    evt do
      Fiber.schedule do
        yield(proc do
          Fiber.schedule do
            sleep 0.02
            out << :inner
          end
        end)
        sleep 0.01
        out << :outer
      end
      Fiber.schedule do
        sleep 0.03
        out << :other
      end
    end
    out
  end
end
