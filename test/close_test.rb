# frozen_string_literal: true

require "test_helper"
require "support/io_helpers"

# IO#close while fibers wait on the IO (Ruby Bug #18455): every such fiber raises IOError, as a Ruby
# thread would; only the waiters on that IO object; at a cost that does not grow with the other
# waiters; and the kernel lets go of the file at once. Ruby 3.3 and 3.4 call no hook on close, so
# evt intercepts IO#close itself; Ruby 4.0's hooks (io_close, fiber_interrupt) are called directly.
class CloseTest < Minitest::Test
  include IOHelpers

  MESSAGE = "stream closed in another thread"

  # A waiter never woken shows as a timeout, sooner than the default.
  def evt(timeout: 10, &block)
    super
  end

  # Runs each waiting block in a fiber of its own, then closes +io+ from another fiber; returns what
  # each waiter raised (or returned) and whether it ended.
  def close_while_waiting(io, waiters, close: -> { io.close })
    outcomes = Array.new(waiters.size)
    evt do
      waiters.each_with_index do |waiter, i|
        Fiber.schedule do
          outcomes[i] = waiter.call
        rescue IOError => e
          outcomes[i] = e
        end
      end
      Fiber.schedule { close.call }
    end
    outcomes
  end

  def assert_closed_under(outcomes)
    outcomes.each do |outcome|
      assert_instance_of IOError, outcome, "a waiter was not interrupted by the close: #{outcome.inspect}"
      assert_equal MESSAGE, outcome.message
    end
  end

  def test_readers_of_a_pipe_raise_ioerror
    r, w = IO.pipe
    outcomes = close_while_waiting(r, [-> { r.read(10) }, -> { r.gets }, -> { r.readpartial(10) },
                                       -> { r.wait_readable }, -> { r.sysread(10) }, -> { r.read_nonblock(10, exception: false) && r.getc }])
    assert_closed_under(outcomes[0, 5])
    assert r.closed?
  ensure
    w&.close
  end

  # evt's IO#close notes what it closes in fiber-local storage, which a frozen Thread refuses: the
  # close goes on without the note (Thread#freeze is rare, but must not leave the IO open).
  def test_a_close_in_a_frozen_thread_still_closes_and_wakes
    outcome = Thread.new do
      Thread.current.freeze
      r, w = IO.pipe
      [close_while_waiting(r, [-> { r.read(1) }]), r.closed?]
    ensure
      w&.close
    end.value
    assert_closed_under(outcome[0])
    assert outcome[1], "the pipe is still open"
  end

  # IO.popen's block form closes its IO by Ruby's own close, which skips IO#close: a fiber still
  # reading it must be woken all the same, from a scheduled fiber and from the thread's blocking
  # fiber (on Ruby 4.0 that close waited for the reader, which the loop could then not run).
  def test_a_popen_blocks_io_closed_at_its_end_wakes_its_reader
    [false, true].each do |from_blocking_fiber|
      outcome = status = nil
      popen = lambda do
        IO.popen([RbConfig.ruby, "-e", "sleep 0.3; puts :late"]) do |io|
          Fiber.schedule do
            outcome = io.read
          rescue IOError => e
            outcome = e
          end
        end
        status = $?
      end
      runner = Thread.new do
        if from_blocking_fiber
          Fiber.set_scheduler(Evt::Scheduler.new)
          popen.call
        else
          evt(&popen)
        end
      end
      assert runner.join(20), "the reader of the popen IO hung (from the blocking fiber: #{from_blocking_fiber})"
      assert_instance_of IOError, outcome, "from the blocking fiber: #{from_blocking_fiber}"
      assert_instance_of Process::Status, status, "the child was not waited for"
    ensure
      runner&.kill
    end
  end

  def test_readers_of_a_socket_raise_ioerror
    a, b = UNIXSocket.pair
    outcomes = close_while_waiting(a, [-> { a.gets }, -> { a.recv(10) }, -> { a.wait_readable(5) }, -> { a.read(1) }])
    assert_closed_under(outcomes)
  ensure
    b&.close
  end

  def test_a_writer_on_a_full_pipe_raises_ioerror
    r, w = IO.pipe
    fill(w)
    outcomes = close_while_waiting(w, [-> { w.write("more") }, -> { w.wait_writable }])
    assert_closed_under(outcomes)
  ensure
    r&.close
  end

  def test_accept_raises_ioerror
    server = TCPServer.new("127.0.0.1", 0)
    outcomes = close_while_waiting(server, [-> { server.accept }])
    assert_closed_under(outcomes)
  end

  def test_io_select_raises_ioerror
    r, w = IO.pipe
    other_r, other_w = IO.pipe
    outcomes = close_while_waiting(r, [-> { IO.select([other_r, r], nil, nil, 5) }])
    assert_closed_under(outcomes)
    # The select's other IO is still watched correctly afterwards.
    evt { Fiber.schedule { other_w.write("x"); assert_equal [[other_r], [], []], IO.select([other_r], nil, nil, 5) } }
  ensure
    [w, other_r, other_w].each { |io| io&.close }
  end

  # Two fibers selecting on one pipe: the first woken reads, closes it and opens another pipe (most
  # likely on the same descriptor number). The other was woken by the same event, so the close did
  # not find it waiting: its select must still see the IO closed, not wait on the new pipe's number.
  # A thread does the same: its select returned, and what it does next with the IO raises.
  def test_io_select_woken_with_another_that_closes_the_io_raises
    r, w = IO.pipe
    outcomes = []
    replacements = []
    took = elapsed do
      evt do
        2.times do
          Fiber.schedule do
            IO.select([r], nil, nil, 5)
            r.read_nonblock(1)
            r.close
            replacements << IO.pipe
            outcomes << :read
          rescue IOError => e
            outcomes << e.message
          end
        end
        Fiber.schedule { w.write("x") }
      end
    end
    assert_equal [:read, "closed stream"], outcomes
    assert_operator took, :<, 4, "the second select waited for its timeout"
  ensure
    w&.close
    replacements.flatten.each(&:close)
  end

  # The same with wait_readable: the second fiber, made ready by the same event as the first, finds
  # its IO closed when it runs, and raises as the close would have had it found the fiber waiting
  # (a thread's wait is interrupted by the close the same way). Ruby 4.0's close interrupts that
  # fiber itself and waits until it has left its wait: its outcome comes first there.
  def test_wait_readable_woken_with_another_that_closes_the_io_raises
    r, w = IO.pipe
    outcomes = []
    replacements = []
    evt do
      2.times do
        Fiber.schedule do
          r.wait_readable(5)
          r.read_nonblock(1)
          r.close
          replacements << IO.pipe
          outcomes << :read
        rescue IOError => e
          outcomes << e.message
        end
      end
      Fiber.schedule { w.write("x") }
    end
    assert_equal RUBY_VERSION >= "4" ? [MESSAGE, :read] : [:read, MESSAGE], outcomes
  ensure
    w&.close
    replacements.flatten.each(&:close)
  end

  def test_a_thousand_readers_on_their_own_pipes_all_raise
    pipes = Array.new(1000) { IO.pipe }
    outcomes = Array.new(1000)
    evt do
      pipes.each_with_index do |(r, _), i|
        Fiber.schedule do
          r.read(1)
        rescue IOError => e
          outcomes[i] = e.message
        end
      end
      Fiber.schedule { pipes.each { |r, _| r.close } }
    end
    assert_equal [MESSAGE] * 1000, outcomes
  ensure
    pipes&.each { |_, w| w.close }
  end

  def test_close_read_and_close_write_wake_their_waiters
    r, w = IO.pipe
    outcomes = close_while_waiting(r, [-> { r.read(1) }], close: -> { r.close_read })
    assert_closed_under(outcomes)
    w.close
    r, w = IO.pipe
    fill(w)
    outcomes = close_while_waiting(w, [-> { w.write("more") }], close: -> { w.close_write })
    assert_closed_under(outcomes)
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_close_read_of_a_socket_shuts_it_down_and_the_reader_sees_end_of_file
    a, b = UNIXSocket.pair
    outcomes = close_while_waiting(a, [-> { a.read(1) }], close: -> { a.close_read })
    assert_equal [nil], outcomes
  ensure
    [a, b].each { |io| io&.close }
  end

  # A socket shut down in one direction is closed by shutting down the other: BasicSocket's own
  # close_read and close_write, and IO's, close the descriptor then, and its waiters must be woken
  # first (epoll and io_uring otherwise kept them waiting on a descriptor that was gone).
  def test_shutting_down_a_sockets_last_direction_closes_it_under_its_waiters
    {
      "BasicSocket#close_read" => ->(s) { s.close_read },
      "IO#close_read" => ->(s) { IO.instance_method(:close_read).bind_call(s) },
    }.each do |name, close_read|
      a, b = UNIXSocket.pair
      a.close_write
      outcomes = close_while_waiting(a, [-> { a.read(1) }, -> { a.wait_readable }], close: -> { close_read.call(a) })
      assert_predicate a, :closed?, name
      assert_closed_under(outcomes)
    ensure
      [a, b].each { |io| io&.close }
    end
  end

  def test_shutting_down_a_sockets_write_side_last_closes_it_under_its_writer
    {
      "BasicSocket#close_write" => ->(s) { s.close_write },
      "IO#close_write" => ->(s) { IO.instance_method(:close_write).bind_call(s) },
    }.each do |name, close_write|
      a, b = UNIXSocket.pair
      a.close_read
      fill(a)
      outcomes = close_while_waiting(a, [-> { a.write("more") }], close: -> { close_write.call(a) })
      assert_predicate a, :closed?, name
      assert_closed_under(outcomes)
    ensure
      [a, b].each { |io| io&.close }
    end
  end

  def test_close_from_another_thread
    r, w = IO.pipe
    a, b = UNIXSocket.pair
    started = Thread::Queue.new
    outcomes = []
    thread = Thread.new do
      evt do
        Fiber.schedule { started << 1; r.read(1) rescue outcomes << $! }
        Fiber.schedule { started << 1; a.gets rescue outcomes << $! }
      end
    end
    2.times { started.pop }
    Thread.pass until thread.status == "sleep" || !thread.alive? # the loop waits in the kernel
    r.close
    a.close
    # The kernel released the socket: the peer sees end of file.
    assert_equal "", Timeout.timeout(10) { b.read }
    assert thread.join(10), "the waiters in the other thread were never woken"
    assert_closed_under(outcomes)
    assert_equal 2, outcomes.size
  ensure
    [w, b].each { |io| io&.close }
  end

  # The closer is the thread's own blocking fiber, not a scheduled one: the waiters raise when the
  # thread next lets the loop run, and the close does not wait for them forever (Ruby 4.0 waits for
  # the fibers it interrupts; the loop must run them first).
  def test_close_from_the_thread_s_own_blocking_fiber
    r, w = IO.pipe
    outcomes = []
    thread = Thread.new do
      Fiber.set_scheduler(Evt::Scheduler.new)
      2.times { Fiber.schedule { r.read(1) rescue outcomes << $! } }
      r.close
      :closed
    end
    assert thread.join(10), "the close, or the waiters, never ended"
    assert_equal :closed, thread.value
    assert_equal 2, outcomes.size
    assert_closed_under(outcomes)
  ensure
    w&.close
  end

  def test_close_from_a_fiber_of_another_scheduler
    r, w = IO.pipe
    started = Thread::Queue.new
    outcome = nil
    reader = Thread.new { evt { Fiber.schedule { started << 1; begin; r.read(1); rescue IOError => e; outcome = e; end } } }
    started.pop
    Thread.pass until reader.status == "sleep" || !reader.alive? # the reader waits in its loop
    Thread.new { evt { Fiber.schedule { r.close } } }.join
    assert reader.join(10), "the reader was never woken"
    assert_closed_under([outcome])
  ensure
    w&.close
  end

  # The close lands while the reader's thread is inside Ruby's own read (the closer wants the GVL
  # when the reader lets it go for read(2)): Ruby makes the closer wait for the reader, which wakes
  # it through the closer's scheduler's #unblock with "stream closed" pending on its own thread.
  def test_close_from_a_fiber_of_another_scheduler_during_a_transfer
    r, w = IO.pipe
    closing = reading = false
    outcome = nil
    reader = Thread.new do
      evt do
        Fiber.schedule do
          Thread.pass until closing
          reading = true
          r.read(1)
        rescue IOError => e
          outcome = e
        end
      end
    end
    Thread.new { evt { Fiber.schedule { closing = true; Thread.pass until reading; r.close } } }.join
    assert reader.join(10), "the reader was never woken"
    assert_closed_under([outcome])
  ensure
    w&.close
  end

  def test_only_the_waiters_on_the_closed_io_object_are_woken
    r, w = IO.pipe
    alias_io = IO.for_fd(r.fileno, autoclose: false) # the same descriptor, another IO object
    result = nil
    evt do
      Fiber.schedule { result = r.read(5) }
      Fiber.schedule do
        alias_io.close # leaves the descriptor open, and the waiter on r waiting
        w.write("still")
      end
    end
    assert_equal "still", result
  ensure
    [r, w].each { |io| io&.close }
  end

  def test_the_peer_sees_end_of_file_as_soon_as_close_returns
    pairs = Array.new(3) { UNIXSocket.pair }
    seen = nil
    evt do
      Fiber.schedule { pairs[0][0].gets rescue nil }          # a read the backend may do itself
      Fiber.schedule { pairs[1][0].wait_readable rescue nil } # a readiness wait
      Fiber.schedule { IO.select([pairs[2][0]]) rescue nil }  # a select
      Fiber.schedule do
        pairs.each { |a, _| a.close }
        seen = pairs.map { |_, b| b.read_nonblock(1, exception: false) }
      end
    end
    assert_equal [nil, nil, nil], seen, "a peer did not see end of file at once (:wait_readable: the kernel still held the file)"
  ensure
    pairs&.each { |pair| pair.each { |io| io.close unless io.closed? } }
  end

  def test_a_new_io_on_the_same_number_never_sees_the_old_files_events
    r, w = IO.pipe
    keep = r.dup # keeps the old file open after r is closed
    number = r.fileno
    outcome = nil
    evt do
      Fiber.schedule { r.read(1) rescue nil }
      Fiber.schedule do
        r.close
        new_r, new_w = IO.pipe
        skip "the new pipe did not get the old number" unless new_r.fileno == number
        w.write("old") # the old file becomes readable
        outcome = new_r.wait_readable(0.2) # must time out: nothing was written to the new pipe
        new_w.write("new")
        outcome = [outcome, new_r.read(3)]
        [new_r, new_w].each(&:close)
      end
    end
    assert_equal [nil, "new"], outcome
  ensure
    [w, keep].each { |io| io&.close }
  end

  def test_closing_costs_the_same_with_thousands_of_other_waiters
    if (SELECT || %i[select poll].include?(BACKEND)) && RUBY_VERSION >= "4"
      skip "Ruby 4.0's close waits for the fiber it interrupts, which takes a turn of the loop, and a turn of " \
           "poll(2), select(2) or the pure-Ruby loop costs in proportion to the IOs it watches"
    end
    costs = [10, 3000].map do |others|
      idle = Array.new(others) { IO.pipe }
      pipes = Array.new(200) { IO.pipe }
      per_close = nil
      evt do
        idle.each { |r, _| Fiber.schedule { r.read(1) } }
        pipes.each { |r, _| Fiber.schedule { r.read(1) rescue nil } }
        Fiber.schedule do
          per_close = elapsed { pipes.each { |r, _| r.close } } / pipes.size
          idle.each { |_, w| w.write("x") }
        end
      end
      (idle + pipes).each { |pair| pair.each { |io| io.close unless io.closed? } }
      per_close
    end
    # Generous: a cost that grew with the other waiters would be ~300 times larger.
    assert_operator costs[1], :<, costs[0] * 10 + 0.000_05, "closing cost #{costs.map { |c| (c * 1e6).round(1) }} µs"
  end

  # With thousands of fibers alive every minor GC marks them all, so an object made per close costs
  # more than the close: evt's closes of IOs with a waiter make no more objects than Ruby's own
  # closes under blocked threads (the IOError, its backtrace and, on Ruby 4.0, a Mutex).
  def test_a_close_under_a_waiter_makes_no_more_objects_than_ruby_does_for_threads
    skip "the pure-Ruby loop's closes are written in Ruby and allocate" if SELECT
    count = 200
    per_close = lambda do |pipes, &wait_for_readers|
      before = GC.stat(:total_allocated_objects)
      pipes.each { |r, _| r.close }
      wait_for_readers.call
      (GC.stat(:total_allocated_objects) - before).fdiv(count)
    end

    pipes = Array.new(count) { IO.pipe }
    threads = pipes.map { |r, _| Thread.new { r.read(1) rescue IOError } }
    Thread.pass until threads.all? { |t| t.status == "sleep" }
    by_threads = per_close.call(pipes) { threads.each(&:join) }
    pipes.each { |_, w| w.close }

    pipes = Array.new(count) { IO.pipe }
    woken = 0
    by_evt = nil
    evt do
      pipes.each { |r, _| Fiber.schedule { r.read(1) rescue woken += 1 } }
      Fiber.schedule { by_evt = per_close.call(pipes) { sleep 0 until woken == count } }
    end
    pipes.each { |_, w| w.close }
    assert_equal count, woken
    assert_operator by_evt, :<=, by_threads + 0.5,
                    "objects made per close: #{by_evt.round(2)} under evt, #{by_threads.round(2)} under threads"
  end

  def test_an_io_nobody_waits_on_closes_as_usual
    r, w = IO.pipe
    evt do
      Fiber.schedule do
        assert_nil w.close
        assert_nil w.close # closing twice is allowed
        assert_raises(IOError) { w.write("x") }
      end
    end
    assert w.closed?
    assert_equal "", r.read
  ensure
    r&.close
  end

  # Ruby 4.0's hooks, called here directly (no Ruby 4.0 on this machine).
end
