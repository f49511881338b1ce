# frozen_string_literal: true

require "test_helper"

# Ruby 4.0's hooks for closing and interrupting: io_close(fd), which closes a descriptor Ruby hands
# over, and fiber_interrupt, which Ruby calls to end a fiber's wait on an IO being closed (they are
# answered on every Ruby: a caller may call them directly).
class CloseHooksTest < Minitest::Test
  # A waiter never woken shows as a timeout, sooner than the default.
  def evt(timeout: 10, &block)
    super
  end

  def test_fiber_interrupt_raises_in_a_waiting_fiber
    r, w = IO.pipe
    error = IOError.new("interrupted")
    outcome = nil
    evt do
      reader = Fiber.schedule do
        r.read(1)
      rescue IOError => e
        outcome = e
      end
      Fiber.schedule { Fiber.scheduler.fiber_interrupt(reader, error) }
    end
    assert_same error, outcome
  ensure
    [r, w].each { |io| io&.close }
  end

  # Two fibers wait on a pipe; once it is readable, the first runs and interrupts the second with
  # `error` (nil: closes the pipe, and Ruby 4.0 interrupts it), which an event has made ready behind
  # it. The second then runs the block with the pipe (after the IOError of its wait, if closed).
  # Returns the block's value or the IOError the second fiber got, and the order they ran in.
  def interrupt_a_fiber_made_ready(error)
    r, w = IO.pipe
    order = []
    outcome = reader = nil
    evt do
      Fiber.schedule do
        r.wait_readable
        order << :interrupter
        error ? Fiber.scheduler.fiber_interrupt(reader, error) : r.close
      end
      reader = Fiber.schedule do
        begin
          r.wait_readable
        rescue IOError
          raise unless r.closed?
        end
        order << :reader
        outcome = yield(r)
      rescue IOError => e
        outcome = e
      end
      Fiber.schedule { w.write("x") }
    end
    [outcome, order]
  ensure
    [r, w].each { |io| io&.close unless io&.closed? }
  end

  # An interrupt is for the wait its fiber is in when it comes (Ruby 4.0's IO#close interrupts the
  # fibers in a read, write or wait of the IO). A fiber that an event has made ready already leaves
  # that wait on its own: served on the loop's next turn, the interrupt would land in whatever the
  # fiber waits for next (this fiber's sleep; in httpx, a finalizer's File.unlink).
  def test_fiber_interrupt_of_a_fiber_made_ready_meanwhile_is_dropped
    outcome, order = interrupt_a_fiber_made_ready(IOError.new("stale")) do
      sleep 0.01
      :slept
    end
    assert_equal %i[interrupter reader], order
    assert_equal :slept, outcome
  end

  # The same fiber back in a wait on an IO gets it: perhaps it waits on the IO being closed again,
  # which Ruby 4.0's IO#close, its flush letting fibers run before it marks the IO closed, waits for
  # it to leave.
  def test_fiber_interrupt_of_a_fiber_made_ready_reaches_its_next_wait_on_an_io
    error = IOError.new("for the wait on r")
    outcome, order = interrupt_a_fiber_made_ready(error) do |r|
      r.read_nonblock(1)
      r.wait_readable(5)
      :waited
    end
    assert_equal %i[interrupter reader], order
    assert_same error, outcome
  end

  # Not a wait on another IO: the close was for the IO the fiber waited on when it came.
  def test_fiber_interrupt_of_a_fiber_made_ready_skips_its_next_wait_on_another_io
    other_r, other_w = IO.pipe
    outcome, order = interrupt_a_fiber_made_ready(IOError.new("stale")) do
      other_r.wait_readable(0.01)
      :waited
    end
    assert_equal %i[interrupter reader], order
    assert_equal :waited, outcome
  ensure
    [other_r, other_w].each { |io| io&.close }
  end

  # The same through IO#close, as Ruby 4.0 calls it: the reader, made ready by the byte written,
  # finds its IO closed when it runs (IOError), and its next wait, on another IO, is left alone.
  def test_a_close_behind_a_reader_made_ready_does_not_reach_its_next_wait
    other_r, other_w = IO.pipe
    outcome, order = interrupt_a_fiber_made_ready(nil) { other_r.wait_readable(0.02).inspect }
    assert_equal %i[interrupter reader], order
    assert_equal "nil", outcome
  ensure
    [other_r, other_w].each { |io| io&.close }
  end

  # Another thread closes a file while a fiber reads it: the thread runs while the read has let go
  # of the GVL (the pure-Ruby loop's read, in Ruby, lets it in before and during the system call),
  # and Ruby 4.0's close interrupts the fiber, then waits for the read to end. The read ends on its
  # own; the interrupt is not for the fiber's next wait, on another IO.
  def test_a_close_from_another_thread_during_a_read_does_not_reach_the_next_wait
    skip "no /dev/zero here" unless File.exist?("/dev/zero")
    file = File.open("/dev/zero")
    other_r, other_w = IO.pipe
    go = Thread::Queue.new
    closer = Thread.new { go.pop && file.close }
    read = after = nil
    evt do
      Fiber.schedule do
        go << true
        read = begin
          file.read(32 << 20)&.bytesize # long enough for the thread to run meanwhile
        rescue IOError
          :closed
        end
        after = other_r.wait_readable(0.05).inspect
      rescue IOError => e
        after = e
      end
    end
    closer.join
    assert_includes [32 << 20, :closed], read
    assert_equal "nil", after
  ensure
    closer&.join
    [file, other_r, other_w].each { |io| io&.close unless io&.closed? }
  end

  def test_fiber_interrupt_needs_a_fiber_or_a_stand_in
    evt do
      error = assert_raises(TypeError) { Fiber.scheduler.fiber_interrupt(nil, IOError.new) }
      assert_match(/needs a Fiber, or an object that answers alive\?, raise and transfer; NilClass does not answer alive\?/,
                   error.message)
      half = Struct.new(:fiber) { def alive? = fiber.alive? }.new(Fiber.current)
      error = assert_raises(TypeError) { Fiber.scheduler.fiber_interrupt(half, IOError.new) }
      assert_match(/does not answer raise/, error.message)
    end
  end

  # A stand-in for a fiber (scheduler interface 5, ruby/ruby#18793): anything that answers alive?,
  # raise and transfer, as a wrapper around a fiber does.
  class FiberStandIn
    attr_reader :raised

    def initialize(fiber)
      @fiber = fiber
    end

    def alive? = @fiber.alive?

    def raise(exception)
      @raised = exception
      @fiber.raise(exception)
    end

    def transfer(*arguments) = @fiber.transfer(*arguments)
  end

  def test_fiber_interrupt_takes_a_stand_in_for_a_fiber
    r, w = IO.pipe
    error = IOError.new("through the stand-in")
    outcome = stand_in = nil
    after = false
    evt do
      reader = Fiber.schedule do
        r.read(1)
      rescue IOError => e
        outcome = e
      end
      stand_in = FiberStandIn.new(reader)
      Fiber.schedule do
        Fiber.scheduler.fiber_interrupt(stand_in, error)
        sleep 0 # the loop serves the interrupt on its next turn, and comes back to this fiber
        after = true
      end
    end
    assert_same error, outcome
    assert_same error, stand_in.raised, "the loop must go through the stand-in's raise"
    assert after, "the fiber that asked must run on"
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_fiber_interrupt_from_another_thread
    r, w = IO.pipe
    started = Thread::Queue.new
    outcome = nil
    scheduler = reader = nil
    thread = Thread.new do
      evt do
        scheduler = Fiber.scheduler
        reader = Fiber.schedule do
          r.read(1)
        rescue IOError => e
          outcome = e
        end
        started << reader # it waits in the read by now: a scheduled fiber runs until it waits
      end
    end
    started.pop
    scheduler.fiber_interrupt(reader, IOError.new("from afar"))
    assert thread.join(10), "the interrupted fiber never ran"
    assert_equal "from afar", outcome&.message
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_io_close_closes_the_descriptor
    r, w = IO.pipe
    fd = r.fileno
    r.autoclose = false
    results = nil
    evt do
      Fiber.schedule do
        results = [Fiber.scheduler.io_close(fd), File.exist?("/proc/self/fd/#{fd}") && File.readlink("/proc/self/fd/#{fd}")]
      end
    end
    assert_equal true, results[0]
    refute_match(/pipe/, results[1].to_s, "the descriptor is still open")
    assert_raises(Errno::EPIPE) { w.write("x") } # no reader left
  ensure
    w&.close
  end

  # A fiber that leaves io_close before the loop's next wait (a timeout due at once) still closes the
  # descriptor: on io_uring the close is queued in the ring by then, and must reach the kernel.
  def test_io_close_left_early_still_closes_the_descriptor
    r, w = IO.pipe
    fd = r.fileno
    r.autoclose = false
    timed_out = false
    evt do
      Fiber.schedule do
        Fiber.scheduler.timeout_after(0, Timeout::Error) { Fiber.scheduler.io_close(fd) }
      rescue Timeout::Error
        timed_out = true
      end
    end
    target = File.exist?("/proc/self/fd/#{fd}") && File.readlink("/proc/self/fd/#{fd}")
    refute_match(/pipe/, target.to_s, "the descriptor leaked (timed out: #{timed_out})")
    assert_raises(Errno::EPIPE) { w.write("x") } # no reader left
  ensure
    w&.close
  end

  def test_io_close_of_a_descriptor_that_is_not_open
    fd = Process.getrlimit(:NOFILE)[0] - 1
    skip "descriptor #{fd} is open" if File.exist?("/proc/self/fd/#{fd}")
    result = nil
    evt { Fiber.schedule { result = Fiber.scheduler.io_close(fd) } }
    assert_equal false, result
  end
end
