# frozen_string_literal: true

require "test_helper"
require "timeout"
require "rbconfig"

# Operations left early, and operations by the thousand. On io_uring a read belongs to the kernel
# until its completion is reaped: leaving it early must cancel and reap it before the memory it
# would write to can be reused. Each test looks for a late write: the abandoned buffers get a
# pattern once the readers are gone, data is sent afterwards, and both must come through intact.
class CancellationTest < Minitest::Test
  class Stop < StandardError; end

  PATTERN = ("evt!" * 16).b

  # +count+ fibers each read into a buffer of their own from a pipe of their own (the block does the
  # read and says how it ended); +stop+, if given, is then called with each reader from another
  # fiber. Returns the readers' outcomes, and checks that the buffers and the pipes were left alone.
  def abandon_reads(count, stop: nil)
    pipes = Array.new(count) { IO.pipe }
    buffers = Array.new(count) { IO::Buffer.new(64) }
    outcomes = []
    evt do
      readers = pipes.each_with_index.map do |(r, _), i|
        Fiber.schedule { outcomes << yield(r, buffers[i]) }
      end
      Fiber.schedule { readers.each { |fiber| stop.call(fiber) } } if stop
    end
    buffers.each { |buffer| buffer.set_string(PATTERN) }
    pipes.each_with_index { |(_, w), i| w.write("data #{i}") }
    sleep 0.05 # not a synchronisation: room for a late kernel write to show
    assert(buffers.all? { |buffer| buffer.get_string(0, 64) == PATTERN }, "an abandoned read wrote into memory it no longer owned")
    received = pipes.map { |r, _| r.read_nonblock(64) }
    assert_equal(Array.new(count) { |i| "data #{i}" }, received, "an abandoned read took data meant for the next reader")
    outcomes
  ensure
    pipes&.each { |pair| pair.each(&:close) }
  end

  def read_into(io, buffer)
    Fiber.scheduler.io_read(io, buffer, 1, 0)
  end

  def test_io_timeout_ends_two_hundred_reads_at_once
    outcomes = abandon_reads(200) do |r, buffer|
      r.timeout = 0.02
      read_into(r, buffer)
    rescue IO::TimeoutError
      :timed_out
    end
    assert_equal [:timed_out] * 200, outcomes
  end

  def test_timeout_timeout_around_two_hundred_reads
    outcomes = abandon_reads(200) do |r, buffer|
      Timeout.timeout(0.02) { read_into(r, buffer) }
    rescue Timeout::Error
      :timed_out
    end
    assert_equal [:timed_out] * 200, outcomes
  end

  def test_fiber_raise_into_two_hundred_readers
    outcomes = abandon_reads(200, stop: ->(fiber) { fiber.raise(Stop) }) do |r, buffer|
      read_into(r, buffer)
    rescue Stop
      :stopped
    end
    assert_equal [:stopped] * 200, outcomes
  end

  def test_fiber_kill_of_two_hundred_readers
    killed = 0
    abandon_reads(200, stop: lambda(&:kill)) do |r, buffer|
      read_into(r, buffer)
    ensure
      killed += 1
    end
    assert_equal 200, killed
  end

  def test_more_reads_at_once_than_the_submission_queue_holds
    pipes = Array.new(1_500) { IO.pipe }
    received = []
    evt do
      pipes.each { |r, _| Fiber.schedule { received << r.read(1) } }
      Fiber.schedule { pipes.each { |_, w| w.write("x") } }
    end
    assert_equal ["x"] * 1_500, received
  ensure
    pipes&.each { |pair| pair.each(&:close) }
  end

  # The io_uring backend's completion queue holds 16,384: these completions arrive together and
  # overflow it, and the kernel holds the rest until the loop asks again.
  def test_more_completions_at_once_than_the_completion_queue_holds
    count = 16_500
    received = 0
    evt(timeout: 120) do
      r, w = IO.pipe
      count.times do
        Fiber.schedule do
          byte = r.sysread(1) # first: `received += r.sysread(1)` would read `received` before waiting
          received += byte.bytesize
        end
      end
      Fiber.schedule do
        written = 0
        written += w.write("y" * (count - written)) while written < count
      end
    end
    assert_equal count, received
  end

  # A send to a full UNIX socket shut down for reading, left just after the loop handed it to the
  # kernel: on io_uring the kernel did not find it where cancellations look (-ENOENT) while it went
  # from its poll to its retry, and the thread waited for its end for ever, holding the GVL (no
  # Timeout, signal or watchdog could reach it). In a child, which such a hang cannot take along.
  def test_a_send_left_just_after_it_reached_the_kernel_ends
    script = <<~'RUBY'
      require "evt"
      require "socket"
      a, b = UNIXSocket.pair
      a.close_read
      loop { break if a.write_nonblock("x" * 65_536, exception: false) == :wait_writable }
      outcomes = Array.new(20) do
        Evt.run do
          writer = Fiber.schedule { a.write("more") rescue $! }
          Fiber.schedule { sleep 0; writer.raise(IOError, "left") } # one turn: the send is in the kernel
          writer
        end
        :left
      end
      puts outcomes.uniq.inspect
    RUBY
    out, status = run_ruby(script, limit: 30)
    assert status&.success?, status ? "the child died (#{status.inspect})" : "the child hung: killed after 30 s"
    assert_equal "[:left]\n", out
  end
end
