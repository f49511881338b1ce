# frozen_string_literal: true

require "test_helper"
require "rbconfig"

# The two conventions of the transfer hooks. Ruby 3.3 to 4.0 call io_read(io, buffer, length, offset)
# and expect at least +length+ bytes; Ruby 4.1 (scheduler interface 4) calls io_read(io, buffer, offset,
# length) and expects one transfer of at most +length+ bytes, or -EAGAIN. evt builds both on one
# primitive and binds io_read and friends to the one this Ruby's headers ask for; the other stays
# reachable as private methods (*_single, *_minimum). No released Ruby has interface 4 yet, so the 4.1
# convention is tested by calling its hooks directly, on every backend.
class InterfaceTest < Minitest::Test
  EAGAIN = -Errno::EAGAIN::Errno
  EINVAL = -Errno::EINVAL::Errno

  # RUBY_FIBER_SCHEDULER_VERSION from this Ruby's own header, read independently of evt.
  def header_version
    header = File.join(RbConfig::CONFIG["rubyhdrdir"], "ruby", "fiber", "scheduler.h")
    File.read(header)[/^#define RUBY_FIBER_SCHEDULER_VERSION (\d+)/, 1]&.to_i
  end

  def scheduler
    Fiber.scheduler
  end

  def buffer(size)
    IO::Buffer.new(size)
  end

  def test_the_build_follows_this_rubys_interface
    assert_equal header_version, SELECT ? Evt::SelectLoop::INTERFACE : Evt::Loop::FIBER_SCHEDULER_VERSION
  end

  # The public io_read follows this Ruby's convention: with 3 of 5 bytes there, the old one waits
  # for the rest (at least length), the new one gives back what one read finds.
  def test_io_read_takes_this_rubys_convention
    r, w = IO.pipe
    version = SELECT ? Evt::SelectLoop::INTERFACE : Evt::Loop::FIBER_SCHEDULER_VERSION
    result = nil
    data = buffer(8)
    evt do
      w.write("abc")
      Fiber.schedule do
        result = version >= 4 ? scheduler.io_read(r, data, 1, 5) : scheduler.io_read(r, data, 5, 1)
      end
      Fiber.schedule { w.write("de") }
    end
    if version >= 4
      assert_equal 3, result
      assert_equal "abc", data.get_string(1, 3)
    else
      assert_equal 5, result
      assert_equal "abcde", data.get_string(1, 5)
    end
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_read_single_reads_at_most_length_at_offset
    r, w = IO.pipe
    w.write("hello world")
    data = buffer(16)
    result = nil
    evt { Fiber.schedule { result = scheduler.send(:io_read_single, r, data, 2, 5) } }
    assert_equal 5, result
    assert_equal "hello", data.get_string(2, 5)
    assert_equal " world", r.read_nonblock(16), "the rest stays in the pipe"
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_read_single_gives_eagain_rather_than_waiting
    r, w = IO.pipe
    result = nil
    evt do
      Fiber.schedule { result = scheduler.send(:io_read_single, r, buffer(8), 0, 8) }
      w.write("late") # after the hook returned: a scheduled fiber runs until it waits
    end
    assert_equal EAGAIN, result
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_read_single_at_end_of_file_gives_zero
    r, w = IO.pipe
    w.close
    result = nil
    evt { Fiber.schedule { result = scheduler.send(:io_read_single, r, buffer(8), 0, 8) } }
    assert_equal 0, result
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_a_range_outside_the_buffer_is_einval_and_length_zero_moves_nothing
    r, w = IO.pipe
    w.write("data")
    results = []
    evt do
      Fiber.schedule do
        results << scheduler.send(:io_read_single, r, buffer(8), 4, 5)
        results << scheduler.send(:io_read_single, r, buffer(8), 9, 0)
        results << scheduler.send(:io_read_single, r, buffer(8), 8, 0)
        results << scheduler.send(:io_write_single, w, buffer(4), 2, 3)
      end
    end
    assert_equal [EINVAL, EINVAL, 0, EINVAL], results
    assert_equal "data", r.read_nonblock(8), "nothing was read"
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_write_single_writes_at_most_length_and_gives_eagain_when_full
    r, w = IO.pipe
    data = buffer(8)
    data.set_string("xxhello!")
    written = full = nil
    evt do
      Fiber.schedule do
        written = scheduler.send(:io_write_single, w, data, 2, 5)
        w.write_nonblock("z" * 65_536) while true # rubocop:disable Lint/LiteralAsCondition
      rescue IO::WaitWritable
        full = scheduler.send(:io_write_single, w, data, 0, 8)
      end
    end
    assert_equal 5, written
    assert_equal "hello", r.read(5)
    assert_equal EAGAIN, full
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_pread_and_pwrite_single_at_a_position
    Dir.mktmpdir do |dir|
      File.open(File.join(dir, "file"), "w+") do |file|
        file.write("0123456789")
        file.rewind
        data = buffer(8)
        data.set_string("ABCDEFGH")
        results = []
        evt do
          Fiber.schedule do
            results << scheduler.send(:io_pwrite_single, file, data, 3, 1, 2) # "BC" at 3
            results << scheduler.send(:io_pread_single, file, data, 2, 4, 4)  # "2BC5" into 4..7
            results << scheduler.send(:io_pread_single, file, data, -1, 0, 1)
          end
        end
        assert_equal [2, 4, EINVAL], results
        assert_equal "ABCD2BC5", data.get_string(0, 8)
        assert_equal 0, file.pos, "positioned transfers leave the file position alone"
        assert_equal "012BC56789", file.read
      end
    end
  end

  def test_read_single_on_a_socket_and_a_file
    a, b = UNIXSocket.pair
    b.write("over the socket")
    Dir.mktmpdir do |dir|
      path = File.join(dir, "file")
      File.write(path, "from the file")
      File.open(path) do |file|
        socket_data = buffer(32)
        file_data = buffer(32)
        results = []
        evt do
          Fiber.schedule do
            results << scheduler.send(:io_read_single, a, socket_data, 0, 4)
            results << scheduler.send(:io_read_single, file, file_data, 0, 32)
          end
        end
        assert_equal [4, 13], results
        assert_equal "over", socket_data.get_string(0, 4)
        assert_equal "from the file", file_data.get_string(0, 13)
      end
    end
  ensure
    [a, b].each { |io| io&.close }
  end

  # The old convention stays reachable under its own name whatever this Ruby calls.
  def test_read_minimum_waits_for_at_least_length
    r, w = IO.pipe
    result = nil
    data = buffer(8)
    evt do
      Fiber.schedule { result = scheduler.send(:io_read_minimum, r, data, 4, 0) }
      Fiber.schedule do
        w.write("ab")
        sleep 0
        w.write("cd")
      end
    end
    assert_equal 4, result
    assert_equal "abcd", data.get_string(0, 4)
  ensure
    [r, w].each { |io| io&.close }
  end
end
