# frozen_string_literal: true

require "test_helper"
require "io/nonblock"
require "io/wait"
require "support/io_helpers"

# Descriptors closed, reused and collected: the errors Ruby raises, and no event for an older file
# ever reaching the IO now on its number.
class IODescriptorsTest < Minitest::Test
  def test_hooks_given_a_closed_io_raise_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.tap(&:close).wait_readable(0) }
    evt do
      r, = IO.pipe
      r.close
      scheduler = Fiber.scheduler
      buffer = IO::Buffer.new(16)
      [
        -> { scheduler.io_wait(r, IO::READABLE, 0) },
        -> { scheduler.io_read(r, buffer, 0, 0) },
        -> { scheduler.io_write(r, buffer, 0, 0) },
        -> { r.read },
      ].each do |call|
        error = assert_raises(expected.class) { call.call }
        assert_equal expected.message, error.message
      end
    end
  end

  # A descriptor closed under its IO, by an IO.for_fd twin (whose close leaves the waiters on the
  # original alone, docs/behaviour.md): the loop does not spin while the wait lasts, whether the
  # backend reports the dead descriptor (its waiter then meets EBADF) or, as epoll, forgets it.
  def test_a_wait_on_a_descriptor_closed_under_its_io_does_not_spin
    cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
    outcome = :never_ended
    used = nil
    evt do
      r, = IO.pipe
      r.autoclose = false # its number may be another file's by the time r is collected
      started = cpu.call
      Fiber.schedule do
        outcome = r.wait_readable(1)
      rescue IOError, SystemCallError => e
        outcome = e
      end
      Fiber.schedule { IO.for_fd(r.fileno, autoclose: true).close }
      Fiber.schedule do
        sleep 1.2 # past the wait's timeout
        used = cpu.call - started
      end
    end
    refute_equal :never_ended, outcome
    assert_operator used, :<, 0.6, "the process used #{used.round(2)} s of CPU over 1.2 s: the loop spun"
  end

  def test_writing_to_a_pipe_nobody_reads_raises_epipe
    evt do
      r, w = IO.pipe
      r.close
      assert_raises(Errno::EPIPE) { w.write("x") }
    end
  end

  def test_read_with_an_offset_past_the_buffer_raises_argument_error
    evt do
      r, = IO.pipe
      assert_raises(ArgumentError) { Fiber.scheduler.io_read(r, IO::Buffer.new(4), 0, 5) }
    end
  end

  def test_a_reader_waiting_inside_evt_on_an_io_closed_meanwhile_raises_instead_of_reading_another_file
    outcome = {}
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        buffer = IO::Buffer.new(5)
        outcome[:old] = Fiber.scheduler.io_read(r, buffer, 5, 0) # waits inside io_read for 5 bytes
      rescue IOError => e
        outcome[:old] = e.class
      end
      Fiber.schedule do
        sleep 0.01
        number = r.fileno
        r.close
        r2, w2 = pipe_reading_at(number)
        outcome[:reused] = (r2.fileno == number)
        Fiber.schedule { outcome[:new] = r2.read(5) }
        w2.write("HELLO")
        w2.close
        w.close
      end
    end
    assert outcome[:reused], "the test needs the number to be reused"
    assert_equal IOError, outcome[:old]
    assert_equal "HELLO", outcome[:new]
  end

  def test_a_reused_descriptor_is_registered_again
    evt do
      r1, w1 = IO.pipe
      Fiber.schedule do
        sleep 0.01
        w1.write("x")
      end
      assert r1.wait_readable(1)
      number = r1.fileno
      r1.close
      w1.close
      r2, w2 = pipe_reading_at(number)
      assert_equal number, r2.fileno, "the test needs the number to be reused"
      Fiber.schedule do
        sleep 0.01
        w2.write("y")
      end
      assert r2.wait_readable(1), "the new IO must be watched, not the closed one"
    end
  end

  def test_an_older_file_with_the_same_number_does_not_wake_the_new_io
    evt do
      r1, w1 = IO.pipe
      keep = r1.dup # the old file stays open, so its kernel registration stays too
      Fiber.schedule do
        sleep 0.01
        w1.write("x")
      end
      assert r1.wait_readable(1)
      r1.read_nonblock(1)
      number = r1.fileno
      r1.close
      r2, w2 = pipe_reading_at(number)
      assert_equal number, r2.fileno, "the test needs the number to be reused"
      Fiber.schedule do
        sleep 0.01
        w1.write("old file")
      end
      assert_nil r2.wait_readable(0.1), "woken by the old file's data"
      w2.write("new")
      assert r2.wait_readable(1)
      keep.close
    end
  end

  def test_waiting_again_after_a_garbage_collection
    evt do
      r, w = IO.pipe
      3.times do |i|
        Fiber.schedule do
          sleep 0.01
          w.write(i.to_s)
        end
        assert r.wait_readable(1)
        assert_equal i.to_s, r.read_nonblock(1)
        GC.start
      end
    end
  end

  private

  # A pipe whose reading end has descriptor `number`, free again: the lowest free number is not
  # always it (a backend's own descriptors, libkqueue's, may be released late), so pipes are made
  # until one lands there. The others are closed.
  def pipe_reading_at(number)
    held = []
    256.times do
      r, w = IO.pipe
      return [r, w] if r.fileno == number

      held << r << w
    end
    IO.pipe
  ensure
    held.each(&:close)
  end
end
