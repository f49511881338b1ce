# frozen_string_literal: true

require "test_helper"

# fork from inside a scheduled fiber: the child starts clean, the parent goes on unaffected.
class ForkTest < Minitest::Test
  # Ruby 4.0 leaves a forked child's thread without a scheduler (3.3 and 3.4 keep the parent's): the
  # forking fiber goes on there as without one, until a scheduler is set again.
  CHILD_KEEPS_SCHEDULER = RUBY_VERSION < "4"

  # Runs in the child; reports through the pipe and leaves with exit! (no at_exit, no minitest).
  # +inherited+: the parent's scheduler, where the fork came from one of its fibers.
  def child_work(writer, inherited = nil)
    results = []
    unless CHILD_KEEPS_SCHEDULER || inherited.nil?
      error = begin
        Fiber.schedule { nil }
      rescue RuntimeError => e
        e.message
      end
      results << (Fiber.scheduler.nil? && error == "No scheduler is available!" ? "none" : "kept: #{error.inspect}")
      Fiber.set_scheduler(inherited)
    end
    # The inherited scheduler: its first use in the child starts over, with the forking fiber
    # driving it; the parent's other fibers do not go on here.
    started = monotonic
    Fiber.schedule { sleep 0.01 }
    sleep 0.02
    results << (monotonic - started >= 0.02 ? "sleep" : "early")
    r, w = IO.pipe
    Fiber.schedule { w.write("pipe") }
    results << r.read(4)
    thread = Thread.new { :joined }
    results << thread.value.to_s
    writer.write(results.join(","))
    writer.close
    exit!(0)
  rescue Exception => e # rubocop:disable Lint/RescueException
    writer.write("#{e.class}: #{e.message}")
    writer.close
    exit!(1)
  end

  def fork_from_a_fiber
    report = status = nil
    parent_fiber_ran = 0
    log_r, log_w = IO.pipe
    evt do
      # Waiting in the parent when the fork happens: it must run there, once, and not in the child.
      Fiber.schedule do
        sleep 0.05
        log_w.write("P")
        parent_fiber_ran += 1
      end
      Fiber.schedule do
        r, w = IO.pipe
        scheduler = Fiber.scheduler
        pid = fork do
          r.close
          child_work(w, scheduler)
        end
        w.close
        report = r.read
        _, status = Process.wait2(pid)
      end
    end
    log_w.close
    [report, status, parent_fiber_ran, log_r.read]
  end

  CHILD_REPORT = CHILD_KEEPS_SCHEDULER ? "sleep,pipe,joined" : "none,sleep,pipe,joined"

  def test_fork_in_a_fiber_on_the_main_thread
    report, status, parent_fiber_ran, log = fork_from_a_fiber
    assert_equal CHILD_REPORT, report
    assert status.success?
    assert_equal 1, parent_fiber_ran
    assert_equal "P", log, "the parent's waiting fiber must not run in the child"
  end

  def test_fork_in_a_fiber_on_another_thread
    report, status, parent_fiber_ran, log = Thread.new { fork_from_a_fiber }.value
    assert_equal CHILD_REPORT, report
    assert status.success?
    assert_equal 1, parent_fiber_ran
    assert_equal "P", log
  end

  def test_a_child_can_set_a_new_scheduler
    report = nil
    evt do
      r, w = IO.pipe
      pid = fork do
        r.close
        Fiber.set_scheduler(Evt::Scheduler.new)
        child_work(w)
      end
      w.close
      report = r.read
      Process.wait(pid)
    end
    assert_equal "sleep,pipe,joined", report
  end

  def test_fork_from_the_loop_fiber_with_fibers_waiting
    log_r, log_w = IO.pipe
    status = nil
    scheduler = Evt::Scheduler.new
    Fiber.set_scheduler(scheduler)
    Fiber.schedule do
      sleep 0.05
      log_w.write("P")
    end
    pid = fork do
      # The child ends its thread normally: closing the inherited scheduler must not run the
      # parent's fiber.
      Fiber.set_scheduler(nil)
      exit!(0)
    end
    _, status = Process.wait2(pid)
    Fiber.set_scheduler(nil)
    log_w.close
    assert status.success?
    assert_equal "P", log_r.read
  end
end
