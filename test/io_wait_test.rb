# frozen_string_literal: true

require "test_helper"
require "io/nonblock"
require "io/wait"
require "support/io_helpers"

# io_wait: the events it gives, its deadlines (IO#timeout too), and what it costs.
class IOWaitTest < Minitest::Test
  include IOHelpers

  def test_io_wait_returns_the_ready_events
    evt do
      r, w = IO.pipe
      assert_equal IO::WRITABLE, Fiber.scheduler.io_wait(w, IO::WRITABLE, 1)
      w.write("x")
      assert_equal IO::READABLE, Fiber.scheduler.io_wait(r, IO::READABLE | IO::PRIORITY, 1)
    end
  end

  # An error or a hang-up wakes every waiter of a descriptor (backend.h's rule), one waiting for
  # IO::PRIORITY alone too; except on select (select(2) cannot tell a hang-up) and on kqueue through
  # libkqueue (no EVFILT_EXCEPT, no NOTE_LOWAT: such a wait is not watched), where its timeout ends it.
  def test_a_hang_up_wakes_a_wait_for_priority_alone
    result = nil
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        sleep 0.01
        w.close
      end
      result = Fiber.scheduler.io_wait(r, IO::PRIORITY, 0.3)
    end
    backend = EvtTest::BACKEND || Evt::Scheduler.availables.first
    if backend == :select || (backend == :kqueue && Evt::Loop.emulation(:kqueue))
      assert_equal false, result
    else
      assert_equal IO::PRIORITY, result
    end
  end

  def test_io_wait_gives_false_when_the_time_is_up
    result = nil
    time = elapsed do
      evt do
        r, = IO.pipe
        result = Fiber.scheduler.io_wait(r, IO::READABLE, 0.05)
      end
    end
    assert_equal false, result
    assert_operator time, :>=, 0.05
  end

  # Data that came before the deadline is data, not a timeout, however late the loop gets to look:
  # here another fiber writes and then keeps the loop busy past the reader's deadline.
  def test_data_that_came_before_the_deadline_is_not_a_timeout
    waited = read = nil
    evt do
      r, w = IO.pipe
      r2, w2 = IO.pipe
      r2.timeout = 0.05
      Fiber.schedule { waited = r.wait_readable(0.05) }
      Fiber.schedule { read = r2.read(1) }
      Fiber.schedule do
        w.write("x")
        w2.write("y")
        busy = monotonic
        nil while monotonic - busy < 0.15
      end
    end
    assert waited, "wait_readable(0.05) timed out on data written before its deadline"
    assert_equal "y", read
  end

  # The same with thousands of waiters whose data came at once: every one of their events must be
  # collected before the timers fire (io_uring's kernel hands out completions still in task work
  # a small batch per entry: most of these readers timed out).
  def test_thousands_of_readers_whose_data_came_before_the_deadline_all_get_it
    count = 2000
    timeout = 0.5
    pipes = Array.new(count) { IO.pipe }
    started = []
    woken = []
    written = nil
    evt do
      pipes.each_with_index do |(r, _), i|
        Fiber.schedule do
          started[i] = monotonic
          woken[i] = r.wait_readable(timeout)
        end
      end
      Fiber.schedule do
        pipes.each { |_, w| w.write("x") }
        written = monotonic
        # Busy past every reader's deadline: the loop looks only afterwards.
        nil while monotonic < started.compact.max + timeout + 0.05
      end
    end
    due_after_write = (0...count).select { |i| started[i] + timeout > written }
    refute_empty due_after_write, "setting up the readers took longer than their timeout"
    assert_equal due_after_write, due_after_write.select { |i| woken[i] }
  ensure
    pipes&.flatten&.each(&:close)
  end

  def test_io_wait_with_zero_timeout_only_looks
    evt do
      r, w = IO.pipe
      assert_equal false, Fiber.scheduler.io_wait(r, IO::READABLE, 0)
      w.write("x")
      assert_equal IO::READABLE, Fiber.scheduler.io_wait(r, IO::READABLE, 0)
    end
  end

  def test_wait_readable_twice_on_unread_data_returns_both_times
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        sleep 0.01
        w.write("x")
      end
      assert r.wait_readable(1)
      assert r.wait_readable(1), "data nobody read is still there"
    end
  end

  # The class is Ruby's without a scheduler too; the message is Ruby's own wording for its
  # scheduler path ("Timed out waiting for IO to become readable!"), raised once io_wait says false.
  def test_io_timeout_raises_io_timeout_error_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.tap { |r| r.timeout = 0.01 }.read(1) }
    evt do
      r, = IO.pipe
      r.timeout = 0.05
      time = elapsed { assert_raises(expected.class) { r.read(1) } }
      assert_operator time, :>=, 0.05
      if RUBY_VERSION >= "3.4"
        assert_nil r.wait_readable, "IO#wait_readable with no argument uses IO#timeout"
      else
        # The documented Ruby 3.3 difference: evt raises where Ruby would give nil.
        assert_raises(IO::TimeoutError) { r.wait_readable }
      end
    end
  end

  def test_io_timeout_on_write_raises_io_timeout_error
    evt do
      a, = UNIXSocket.pair
      fill(a)
      a.timeout = 0.05
      assert_raises(IO::TimeoutError) { a.write("x" * 65_536) }
    end
  end

  def test_a_negative_io_wait_timeout_raises_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.wait_readable(-1) }
    evt do
      r, = IO.pipe
      error = assert_raises(expected.class) { r.wait_readable(-1) }
      assert_equal expected.message, error.message
    end
  end

  # Ruby's own io_read/io_write call sites allocate an IO::Buffer per call; io_wait is measured
  # alone: a plain thread (no scheduler) writes, the fiber waits and reads into a fixed buffer.
  def test_io_wait_allocates_no_objects_in_steady_state
    skip "the select backend allocates a few objects per wait (README, backends)" if SELECT
    allocated = nil
    rounds = 10_000
    a, b = UNIXSocket.pair
    go = Thread::Queue.new
    writer = Thread.new do
      (rounds + 1_000).times do
        go.pop
        b.syswrite("x")
      end
    end
    evt do
      buffer = String.new(capacity: 8)
      before = nil
      (rounds + 1_000).times do |i|
        before = GC.stat(:total_allocated_objects) if i == 1_000 # after warming up
        go.push(:go)
        a.wait_readable
        a.recv_nonblock(8, 0, buffer)
      end
      allocated = GC.stat(:total_allocated_objects) - before
    end
    writer.join
    assert_operator allocated, :<, 100, "objects allocated over #{rounds} waits"
  ensure
    a&.close
    b&.close
  end
end
