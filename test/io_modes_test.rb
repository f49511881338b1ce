# frozen_string_literal: true

require "test_helper"
require "io/nonblock"
require "io/wait"
require "support/io_helpers"

# The calls that must not wait (read_nonblock, write_nonblock), those that must (sysread, syswrite),
# and descriptors in blocking mode, which must not block the other fibers.
class IOModesTest < Minitest::Test
  include IOHelpers

  def test_read_nonblock_does_not_wait
    evt do
      r, w = IO.pipe
      assert_equal :wait_readable, r.read_nonblock(1, exception: false)
      assert_raises(IO::WaitReadable) { r.read_nonblock(1) }
      w.write("x")
      assert_equal "x", r.read_nonblock(1)
    end
  end

  def test_read_nonblock_sees_data_written_just_before_by_the_same_fiber
    evt do
      r, w = IO.pipe
      w.write("ab")
      assert_equal "ab", r.read_nonblock(10)
      w.write("cd")
      assert_equal "cd", r.read_nonblock(10), "no event was dispatched in between, but the data is there"
    end
  end

  # Ruby passes sysread the same arguments as read_nonblock, but sysread counts on the hook to wait.
  def test_sysread_waits_for_data_as_without_a_scheduler
    received = nil
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        sleep 0.01
        w.syswrite("abc")
      end
      received = r.sysread(3)
    end
    assert_equal "abc", received
  end

  def test_syswrite_to_a_full_pipe_waits_for_room
    evt do
      r, w = IO.pipe
      w.write_nonblock("x" * 65_536) # the pipe is full now
      Fiber.schedule do
        sleep 0.01
        r.read(65_536)
      end
      assert_equal 5, w.syswrite("hello")
    end
  end

  def test_write_nonblock_does_not_wait
    evt do
      a, = UNIXSocket.pair
      fill(a)
      assert_equal :wait_writable, a.write_nonblock("x", exception: false)
    end
  end

  def test_a_descriptor_in_blocking_mode_does_not_block_the_other_fibers
    received = nil
    evt do
      r, w = IO.pipe
      r.nonblock = false
      Fiber.schedule { received = r.read(3) }
      Fiber.schedule do
        sleep 0.01
        w.write("abc")
      end
    end
    assert_equal "abc", received
  end

  def test_a_large_write_to_a_pipe_in_blocking_mode_lets_the_reader_run
    received = nil
    evt do
      r, w = IO.pipe
      w.nonblock = false
      Fiber.schedule do
        w.write("x" * 1_000_000)
        w.close
      end
      Fiber.schedule { received = r.read }
    end
    assert_equal 1_000_000, received.bytesize
  end

  def test_a_socket_in_blocking_mode_does_not_block_the_other_fibers
    received = nil
    evt do
      a, b = UNIXSocket.pair
      a.nonblock = false
      b.nonblock = false
      Fiber.schedule { received = a.read(5) }
      Fiber.schedule do
        sleep 0.01
        b.write("x" * 2_000_000) # more than the socket buffers: the writer must wait, not block
        b.write("hello")
      end
      Fiber.schedule do
        sleep 0.02
        a.read(2_000_000 - 5) # whatever the first reader did not take
      end
    end
    assert_equal "xxxxx", received
  end
end
