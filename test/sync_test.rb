# frozen_string_literal: true

require "test_helper"

# block and unblock: Queue, Mutex, ConditionVariable and Thread#join, between fibers and threads.
class SyncTest < Minitest::Test
  def test_queue_between_fibers
    received = []
    evt do
      queue = Thread::Queue.new
      Fiber.schedule { 3.times { received << queue.pop } }
      Fiber.schedule do
        3.times do |i|
          sleep 0.001
          queue << i
        end
      end
    end
    assert_equal [0, 1, 2], received
  end

  def test_queue_pop_with_a_timeout_gives_nil
    result = :unset
    time = elapsed { evt { result = Thread::Queue.new.pop(timeout: 0.05) } }
    assert_nil result
    assert_operator time, :>=, 0.05
  end

  def test_queue_fed_by_another_thread
    received = []
    evt do
      queue = Thread::Queue.new
      Fiber.schedule { 5.times { received << queue.pop } }
      Thread.new { 5.times { |i| queue << i } }
    end
    assert_equal [0, 1, 2, 3, 4], received
  end

  def test_an_unblock_from_another_thread_wakes_the_loop_within_a_millisecond
    latencies = []
    evt do
      queue = Thread::Queue.new
      Fiber.schedule do
        20.times { latencies << (monotonic - queue.pop) }
      end
      Thread.new do
        20.times do
          sleep 0.005 # lets the loop settle into its wait in the kernel
          queue << monotonic
        end
      end
    end
    assert_equal 20, latencies.size
    assert_operator median(latencies), :<, 0.001
  end

  def test_mutex_between_fibers
    order = []
    evt do
      mutex = Mutex.new
      Fiber.schedule do
        mutex.synchronize do
          sleep 0.02
          order << :first
        end
      end
      Fiber.schedule { mutex.synchronize { order << :second } }
    end
    assert_equal %i[first second], order
  end

  def test_mutex_between_a_fiber_and_a_thread
    order = []
    mutex = Mutex.new
    locked = Thread::Queue.new
    thread = Thread.new do
      mutex.synchronize do
        locked << true
        sleep 0.05
        order << :thread
      end
    end
    evt do
      locked.pop
      mutex.synchronize { order << :fiber }
    end
    thread.join
    assert_equal %i[thread fiber], order
  end

  def test_condition_variable_between_fibers
    log = []
    evt do
      mutex = Mutex.new
      condition = ConditionVariable.new
      Fiber.schedule do
        mutex.synchronize do
          condition.wait(mutex)
          log << :woken
        end
      end
      Fiber.schedule do
        mutex.synchronize do
          log << :signal
          condition.signal
        end
      end
    end
    assert_equal %i[signal woken], log
  end

  def test_condition_variable_wait_with_a_timeout
    time = elapsed do
      evt do
        mutex = Mutex.new
        mutex.synchronize { ConditionVariable.new.wait(mutex, 0.05) }
      end
    end
    assert_operator time, :>=, 0.05
    assert_operator time, :<, 1
  end

  def test_condition_variable_signalled_by_another_thread
    woken = false
    mutex = Mutex.new
    condition = ConditionVariable.new
    evt do
      Fiber.schedule do
        mutex.synchronize do
          Thread.new { mutex.synchronize { condition.signal } }
          condition.wait(mutex)
          woken = true
        end
      end
    end
    assert woken
  end

  def test_thread_join_lets_the_other_fibers_run
    ticks = 0
    joined = false
    evt do
      thread = Thread.new { sleep 0.05 }
      Fiber.schedule do
        thread.join
        joined = true
      end
      Fiber.schedule do
        until joined
          ticks += 1
          sleep 0.005
        end
      end
    end
    assert joined
    assert_operator ticks, :>=, 3
  end

  def test_thread_join_with_a_timeout
    result = :unset
    thread = Thread.new { sleep 1 }
    evt { result = thread.join(0.02) }
    assert_nil result
  ensure
    thread&.kill
  end

  def test_block_times_out_with_false_and_unblock_gives_true
    timed_out = unblocked = nil
    evt do
      scheduler = Fiber.scheduler
      timed_out = scheduler.block(:test, 0.01)
      fiber = Fiber.schedule { unblocked = scheduler.block(:test, nil) }
      scheduler.unblock(:test, fiber)
    end
    assert_equal false, timed_out
    assert_equal true, unblocked
  end

  def test_unblocking_a_fiber_that_is_not_blocked_changes_nothing
    order = []
    evt do
      sleeper = Fiber.schedule do
        Fiber.scheduler.block(:test, 0.01)
        order << :timed_out
        Fiber.scheduler.io_wait(IO.pipe.first, IO::READABLE, 0.02)
        order << :io_wait_done
      end
      Fiber.schedule do
        sleep 0.015
        Fiber.scheduler.unblock(:test, sleeper) # it waits on IO now, not in block
        order << :unblocked
      end
    end
    assert_equal %i[timed_out unblocked io_wait_done], order
  end

  # Ruby hands block a timeout unchecked (Queue#pop(timeout: -1)), and without a scheduler takes a
  # negative one as expired: so does evt (false at once); NaN never ends, as for Ruby.
  def test_a_negative_block_timeout_has_expired
    results = []
    evt do
      results << Fiber.scheduler.block(:test, -1) << Fiber.scheduler.block(:test, -0.5)
      results << Thread::Queue.new.pop(timeout: -1)
    end
    assert_equal [false, false, nil], results
  end

  # A trap handler runs while the loop waits in the kernel; a fiber it wakes must run at once.
  def test_a_trap_handler_that_wakes_a_fiber_ends_the_wait
    queue = Thread::Queue.new
    previous = trap("USR2") { queue << :signalled }
    popped = nil
    time = elapsed do
      evt do
        Thread.new { sleep 0.05; Process.kill("USR2", Process.pid) }
        Fiber.schedule { popped = queue.pop }
      end
    end
    assert_equal :signalled, popped
    assert_operator time, :<, 3, "the woken fiber waited for some other event"
  ensure
    trap("USR2", previous || "DEFAULT")
  end

  # A subclass's block may run code before the fiber suspends (here it waits for another thread,
  # with the GVL released). An unblock that arrives meanwhile is for this block and must end it, as
  # a thread's wakeup is kept for its next sleep (Ruby's own test_deadlock of test/fiber).
  def test_an_unblock_that_comes_before_the_fiber_reaches_block_ends_that_block
    gate = Thread::Queue.new
    subclass = Class.new(Evt::Scheduler) do
      define_method(:block) do |blocker, timeout = nil|
        Fiber.blocking { gate.pop } # another thread unblocks this fiber now
        super(blocker, timeout)
      end
    end
    result = nil
    scheduler = subclass.new
    blocking = Thread::Queue.new
    unblocker = Thread.new do
      scheduler.unblock(:test, blocking.pop)
      gate << :go
    end
    thread = Thread.new do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        blocking << Fiber.current
        result = scheduler.block(:test, 10)
      end
      :done
    end
    assert_equal :done, thread.join(8)&.value, "the block waited for its timeout"
    assert_equal true, result
  ensure
    unblocker&.join
  end

  # Another thread pushes after the pop timed out, while the fiber waits to be resumed: that
  # unblock belongs to the pop that is over, not to the fiber's next sleep.
  def test_an_unblock_meant_for_a_finished_wait_does_not_end_the_next_one
    queue = Thread::Queue.new
    slept = nil
    evt do
      Fiber.schedule do
        sleep 0.05
        Fiber.blocking { Thread.new { queue << :late }.join } # the pop below has timed out by now
      end
      Fiber.schedule do
        queue.pop(timeout: 0.05)
        slept = elapsed { sleep 0.3 }
      end
    end
    assert_operator slept, :>=, 0.29
  end

  # Without a scheduler Ruby waits for any duration here (sleep and IO.select raise RangeError).
  def test_a_timeout_too_large_for_the_clock_waits_until_woken
    queue = Thread::Queue.new
    got = nil
    evt do
      Thread.new { sleep 0.05; queue << :value }
      Fiber.schedule { got = queue.pop(timeout: 1e30) }
    end
    assert_equal :value, got
  end
end
