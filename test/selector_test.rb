# frozen_string_literal: true

require_relative "test_helper"

# Evt::Selector (IO::Event::Selector::Evt once evt/async is loaded): evt's loop behind the selector
# interface async uses, on the backend bin/test chose. io-event's and async's own suites run against it
# too (test/peers/run); these tests cover what evt does of its own, and the contract's corners.
class SelectorTest < Minitest::Test
  def setup
    skip "the selector needs the C extension (the pure-Ruby loop has none)" if SELECT

    @selector = Evt::Selector.new(Fiber.current, backend: BACKEND)
  end

  def teardown
    @selector&.close
  end

  # Turns until the block is true (a generous limit: a hang fails the test).
  def select_until(limit: 10)
    deadline = monotonic + limit
    @selector.select(0.05) until yield || monotonic > deadline
    assert yield, "the selector never got there"
  end

  def test_push_runs_fibers_and_objects_in_order_on_the_next_select_only
    order = []
    object = Object.new
    object.define_singleton_method(:alive?) { true }
    object.define_singleton_method(:transfer) { order << :object }
    dead = Object.new
    dead.define_singleton_method(:alive?) { false }
    dead.define_singleton_method(:transfer) { order << :dead }
    second = Fiber.new { order << :second }
    first = Fiber.new do
      order << :first
      @selector.push(second) # pushed while the queue is served: the next select runs it
    end

    @selector.push(first)
    @selector.push(object)
    @selector.push(dead)
    assert @selector.ready?
    @selector.select(0)
    assert_equal %i[first object], order
    @selector.select(0)
    assert_equal %i[first object second], order
    refute @selector.ready?
  end

  def test_pushed_objects_survive_compaction
    count = 0
    objects = Array.new(200) do
      Object.new.tap do |o|
        o.define_singleton_method(:alive?) { true }
        o.define_singleton_method(:transfer) { count += 1 }
      end
    end
    objects.each { |o| @selector.push(o) }
    objects = nil # rubocop:disable Lint/UselessAssignment -- only the selector holds them now
    GC.start
    GC.compact if GC.respond_to?(:compact)
    @selector.select(0)
    assert_equal 200, count
  end

  def test_resume_transfers_arguments_and_the_caller_goes_on_later
    order = []
    child = Fiber.new do |argument|
      order << argument
      @selector.yield
      order << :child_again
    end
    parent = Fiber.new do
      order << :parent
      @selector.resume(child, :to_child)
      order << :parent_again
    end
    @selector.resume(parent)
    assert_equal %i[parent to_child], order
    @selector.select(0)
    assert_equal %i[parent to_child parent_again child_again], order
  end

  # Keywords go to Fiber#raise as they came: cause: where that Ruby's Fiber#raise takes it (4.0), the
  # error Fiber#raise gives for it elsewhere (3.3, 3.4: a TypeError about the backtrace).
  def test_raise_forwards_arguments_and_keywords
    cause = RuntimeError.new("the cause")
    plain = Fiber.new { Fiber.yield }
    plain.resume
    expected = begin
      plain.raise(ArgumentError, "boom", cause: cause)
    rescue Exception => e # rubocop:disable Lint/RescueException
      e
    end

    error = nil
    fiber = Fiber.new do
      @selector.yield
    rescue ArgumentError => e
      error = e
    end
    @selector.resume(fiber)
    begin
      @selector.raise(fiber, ArgumentError, "boom", cause: cause)
    rescue TypeError => e
      error = e
    end
    assert_equal [expected.class, expected.message, expected.cause], [error.class, error.message, error.cause]

    plain_error = nil
    fiber = Fiber.new do
      @selector.yield
    rescue ArgumentError => e
      plain_error = e
    end
    @selector.resume(fiber)
    @selector.raise(fiber, ArgumentError, "no keywords")
    assert_equal "no keywords", plain_error.message
  end

  def test_transfer_on_the_loop_fiber_returns_at_once
    assert_nil @selector.transfer
    assert_same Fiber.current, @selector.loop
  end

  def test_select_rejects_a_bad_duration
    assert_raises(TypeError) { @selector.select("1") }
  end

  def test_wakeup_is_false_when_idle_and_ends_a_blocked_select_from_another_thread
    refute @selector.wakeup
    loop_thread = Thread.current
    woken = nil
    waker = Thread.new do
      Thread.pass until loop_thread.status == "sleep"
      woken = @selector.wakeup
    end
    took = elapsed { @selector.select(30) }
    waker.join
    assert woken
    assert_operator took, :<, 20
    assert_operator @selector.idle_duration, :>, 0.0
    @selector.select(0)
    assert_equal 0.0, @selector.idle_duration
  end

  def test_push_from_another_thread_then_wakeup
    ran = false
    fiber = Fiber.new { ran = true }
    loop_thread = Thread.current
    pusher = Thread.new do
      Thread.pass until loop_thread.status == "sleep"
      @selector.push(fiber)
      @selector.wakeup
    end
    @selector.select(30)
    pusher.join
    @selector.select(0)
    assert ran
  end

  def test_a_pending_masked_interrupt_ends_select_at_once
    result = nil
    took = elapsed do
      Thread.handle_interrupt(RuntimeError => :never) do
        Thread.current.raise(RuntimeError, "later")
        result = @selector.select(5)
      end
    rescue RuntimeError
      nil
    end
    assert_equal 0, result
    assert_operator took, :<, 4
  end

  # An exception from another thread ends a blocked select and goes on out of it (a signal would be
  # held back, as async masks them); the selector goes on working. A select may return 0 before it
  # (the selector's contract allows an interrupted select to), so the test selects again until the
  # exception comes, for 30 s at most: a select that swallowed it fails the test rather than hanging.
  def test_thread_raise_ends_a_blocked_select_and_the_selector_goes_on
    reader, writer = IO.pipe
    got = nil
    Fiber.new { got = @selector.io_wait(Fiber.current, reader, IO::READABLE) }.transfer
    loop_thread = Thread.current
    raiser = Thread.new do
      Thread.pass until loop_thread.status == "sleep"
      # Both before the loop thread runs again: write_nonblock keeps the GVL (IO#write would let the
      # loop thread take it, and its select would end before the exception comes).
      writer.write_nonblock("x")
      loop_thread.raise(RuntimeError, "from another thread")
    end
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    error = assert_raises(RuntimeError) do
      while (left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)).positive?
        @selector.select(left)
      end
    end
    raiser.join
    assert_equal "from another thread", error.message
    select_until { got }
    assert_equal IO::READABLE, got
  ensure
    reader&.close
    writer&.close
  end

  def test_io_wait_gives_the_events_and_waits_for_the_next_select_even_when_ready
    reader, writer = IO.pipe
    writer.write("x")
    result = nil
    fiber = Fiber.new { result = @selector.io_wait(Fiber.current, reader, IO::READABLE) }
    fiber.transfer
    assert_nil result, "io_wait went on before the loop ran"
    @selector.select(0)
    assert_equal IO::READABLE, result
  ensure
    reader&.close
    writer&.close
  end

  def test_io_wait_is_false_when_resumed_without_its_events
    reader, writer = IO.pipe
    result = :none
    fiber = Fiber.new { result = @selector.io_wait(Fiber.current, reader, IO::READABLE) }
    fiber.transfer
    fiber.transfer # as async's timeout does
    assert_equal false, result
    writer.write("x") # the registration is gone: nothing to resume
    assert_equal 0, @selector.select(0)
  ensure
    reader&.close
    writer&.close
  end

  # evt's IO#close wakes the fibers waiting on the IO, from this thread or another, on every Ruby
  # (io-event's selectors leave them waiting before Ruby 4.0).
  def test_closing_an_io_wakes_its_waiters_with_ioerror
    [false, true].each do |other_thread|
      reader, writer = IO.pipe
      error = nil
      Fiber.new do
        @selector.io_wait(Fiber.current, reader, IO::READABLE)
      rescue IOError => e
        error = e
      end.transfer
      other_thread ? Thread.new { reader.close }.join : reader.close
      select_until { error }
      assert_kind_of IOError, error
      writer.close
    end
  end

  def test_io_read_and_io_write_through_the_loop
    reader, writer = UNIXSocket.pair
    got = nil
    read = Fiber.new do
      buffer = IO::Buffer.new(5)
      got = [@selector.io_read(Fiber.current, reader, buffer, 5), buffer.get_string]
    end
    read.transfer
    assert_nil got
    wrote = nil
    write = Fiber.new { wrote = @selector.io_write(Fiber.current, writer, IO::Buffer.for("hello"), 5) }
    write.transfer
    select_until { got }
    assert_equal 5, wrote
    assert_equal [5, "hello"], got
  ensure
    reader&.close
    writer&.close
  end

  def test_io_read_ranges_as_io_event_has_them
    reader, writer = IO.pipe
    buffer = IO::Buffer.new(8)
    results = nil
    Fiber.new do
      results = [
        @selector.io_read(Fiber.current, reader, buffer, 1, 9),
        @selector.io_read(Fiber.current, reader, buffer, 1, 8),
        @selector.io_read(Fiber.current, reader, buffer, 0), # one try: nothing there
      ]
    end.transfer
    assert_equal [-Errno::EINVAL::Errno, 0, -Errno::EAGAIN::Errno], results
  ensure
    reader&.close
    writer&.close
  end

  def test_ruby_4_1_convention_offset_then_length
    reader, writer = UNIXSocket.pair
    writer.write("abcdef")
    buffer = IO::Buffer.new(8)
    result = nil
    Fiber.new do
      result = @selector.send(:io_read_single, Fiber.current, reader, buffer, 2, 3)
    end.transfer
    select_until { result }
    assert_equal 3, result
    assert_equal "abc", buffer.get_string(2, 3)
    rest = IO::Buffer.new(4)
    assert_equal 3, @selector.send(:io_read_single, Fiber.current, reader, rest, 0, 4) # at most 4: what is there
    assert_equal "def", rest.get_string(0, 3)
    assert_equal(-Errno::EAGAIN::Errno, @selector.send(:io_read_single, Fiber.current, reader, rest, 0, 4))
  ensure
    reader&.close
    writer&.close
  end

  def test_a_read_on_the_loop_fiber_blocks_it_as_without_a_scheduler
    reader, writer = UNIXSocket.pair
    writer_thread = Thread.new do
      sleep 0.05
      writer.write("late")
    end
    buffer = IO::Buffer.new(4)
    assert_equal 4, @selector.io_read(Fiber.current, reader, buffer, 4)
    assert_equal "late", buffer.get_string
    writer_thread.join
  ensure
    reader&.close
    writer&.close
  end

  def test_process_wait_for_a_child_and_for_any_child
    statuses = []
    first = Process.spawn(RbConfig.ruby, "-e", "exit 3")
    Fiber.new { statuses << @selector.process_wait(Fiber.current, first, 0) }.transfer
    select_until { statuses.size == 1 }
    second = Process.spawn(RbConfig.ruby, "-e", "exit 4")
    Fiber.new { statuses << @selector.process_wait(Fiber.current, -1, 0) }.transfer
    select_until { statuses.size == 2 }
    assert_equal [[first, 3], [second, 4]], statuses.map { |s| [s.pid, s.exitstatus] }
  end

  def test_closed_after_close_and_in_a_forked_child
    selector = Evt::Selector.new(Fiber.current, backend: BACKEND)
    refute selector.closed?
    reader, writer = IO.pipe
    pid = fork do
      writer.write(selector.closed? ? "closed" : "open")
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    assert_equal "closed", reader.read
    selector.close
    assert selector.closed?
    assert_raises(IOError) { selector.select(0) }
  ensure
    reader&.close
  end

  # Fibers left suspended in a selector that is closed and dropped: the selector forgets them at
  # close, so IO#close on their descriptors later (the fibers' stacks perhaps freed first by the GC)
  # does not walk their waiters.
  def test_closing_forgets_the_fibers_still_suspended_in_it
    pipes = Array.new(20) { IO.pipe }
    3.times do
      3.times do
        selector = Evt::Selector.new(Fiber.current, backend: BACKEND)
        pipes.each { |r, _| selector.push(Fiber.new { selector.io_wait(Fiber.current, r, IO::READABLE) }) }
        selector.select(0)
        selector.close
      end
      GC.start(immediate_sweep: false) # the fibers and selectors are garbage; sweeping comes later
      5.times { Fiber.new { Array.new(100) { "x" * 10 } }.resume }
      pipes.each { |r, w| r.close && w.close }
      pipes = Array.new(20) { IO.pipe }
    end
    pipes.each { |r, w| r.close && w.close }
    pass
  end

  def test_a_closed_selector_refuses_waits_and_stays_closed
    reader, writer = IO.pipe
    selector = Evt::Selector.new(Fiber.current, backend: BACKEND)
    selector.close
    before = descriptor_table
    assert_raises(IOError) { selector.yield }
    assert_raises(IOError) { selector.io_wait(Fiber.current, reader, IO::READABLE) }
    assert_raises(IOError) { selector.io_read(Fiber.current, reader, IO::Buffer.new(1), 1) }
    assert_raises(IOError) { selector.resume(Fiber.new {}) }
    assert selector.closed?
    assert_nil selector.close
    assert_no_descriptor_leaked(before, "a closed selector opened its kernel objects again")
  ensure
    reader&.close
    writer&.close
  end

  def test_close_from_another_thread_is_refused
    closer = Thread.new do
      Thread.current.report_on_exception = false
      @selector.close
    end
    assert_raises(ThreadError) { closer.value }
    refute @selector.closed?
  end

  # Length 0 is one try: -EAGAIN once the socket is full, not a wait for room (on io_uring the try is
  # a ring operation that does not wait, so the fiber comes back from the loop).
  def test_write_of_length_zero_is_one_try
    reader, writer = UNIXSocket.pair
    chunk = IO::Buffer.new(1 << 16)
    result = nil
    Fiber.new do
      result = @selector.io_write(Fiber.current, writer, chunk, 0) while result.nil? || result.positive?
    end.transfer
    select_until { result && !result.positive? }
    assert_equal(-Errno::EAGAIN::Errno, result)
  ensure
    reader&.close
    writer&.close
  end

  def test_no_descriptor_left_after_close
    before = descriptor_table
    10.times { Evt::Selector.new(Fiber.current, backend: BACKEND).close }
    assert_no_descriptor_leaked(before)
  end

  def test_a_bad_loop_or_backend_is_refused
    assert_raises(TypeError) { Evt::Selector.new(:not_a_fiber, backend: BACKEND) }
    assert_raises(ArgumentError) { Evt::Selector.new(Fiber.current, backend: :nonesuch) }
  end
end
