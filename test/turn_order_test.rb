# frozen_string_literal: true

require "test_helper"

# The order of a turn, which is the C core's policy (ext/evt/loop.c, waiter.c): each scenario runs on
# the C loop and writes a trace, which fiber ran when and what each wait returned or raised, held to
# the trace written down (so a scenario cannot pass by doing nothing). The pure-Ruby loop promises no
# order between fibers (README, "The pure-Ruby loop"), only each fiber's own behaviour: it runs the
# same scenarios, held to each fiber's part of the same trace, in order (and, where Ruby's semantics
# fix an order, as for a fiber that starts another, to that order).
#
# Orders only, no durations: timers whose order counts are 20 ms apart or more. Reads and writes
# whose moment counts are done without waiting (the *_nonblock methods, or on the main fiber before
# the fibers start): io_uring hands any transfer that may wait to the ring, where even one that could
# be done at once waits for its completion. Equal deadlines (to the nanosecond) cannot be made
# through the hooks, which read the clock for each timer.
class TurnOrderTest < Minitest::Test
  MESSAGE = "stream closed in another thread"

  # bin/test's backend when the C loop has it (select is one of the C loop's on Linux), else the
  # first one that runs here.
  def c_backend
    return EvtTest::BACKEND if EvtTest::BACKEND && Evt::Loop.backends.include?(EvtTest::BACKEND)

    Evt::Loop.backends.find { |name| Evt::Loop.probe(name).nil? }
  end

  # Runs +scenario+ on the main fiber with +scheduler+ set, then the loop until every fiber ended.
  def trace_on(scheduler, scenario)
    trace = []
    Timeout.timeout(30) do # a hang fails the test
      Fiber.set_scheduler(scheduler)
      begin
        scenario.call(trace)
      ensure
        Fiber.set_scheduler(nil)
      end
    end
    trace
  end

  def assert_trace(expected, &scenario)
    if Evt.extension?
      c = trace_on(Evt::Scheduler.new(backend: c_backend), scenario)
      assert_equal expected, c, "the C loop's order on #{c_backend} (actual) is not the one written down"
    end
    ruby = trace_on(Evt::SelectScheduler.new, scenario)
    assert_equal by_fiber(expected), by_fiber(ruby), "a fiber's own events on the pure-Ruby loop (actual) differ"
    ruby
  end

  # Each fiber's part of a trace, in order: what a fiber saw, whatever the others did meanwhile.
  def by_fiber(trace) = trace.group_by(&:first)

  # What the block returned, or what it raised.
  def outcome
    [:returned, yield]
  rescue StandardError => e
    [:raised, e.class, e.message]
  end

  def closed
    [:raised, IOError, MESSAGE]
  end

  # Fills a pipe (or socket) until a write would wait; from the blocking main fiber, without hooks.
  def fill(io)
    loop { break if io.write_nonblock("x" * 65_536, exception: false) == :wait_writable }
  end

  def drain(io)
    loop { break unless io.read_nonblock(65_536, exception: false).is_a?(String) }
  end

  # The IOs a scenario opened, closed whatever happened.
  def ios
    @ios ||= []
  end

  def teardown
    @ios&.each { |io| io.close unless io.closed? }
  end

  def pipe
    ios.concat(IO.pipe).last(2)
  end

  # ---- ready fibers and timers -----------------------------------------------------------------

  def test_ready_fibers_run_in_the_order_they_became_ready
    expected = [[:a, 0], [:b, 0], [:child, 0], [:c, 0], [:b, 1], [:a, 1], [:child, 1], [:c, 1], [:b, 2]]
    assert_trace(expected) do |t|
      Fiber.schedule { 2.times { |i| t << [:a, i]; sleep 0 } }
      Fiber.schedule do
        t << [:b, 0]
        # Started at once; the fiber that scheduled it waits at the head of the ready queue meanwhile
        # (the main fiber goes on first: it is the loop's).
        Fiber.schedule { t << [:child, 0]; sleep 0; t << [:child, 1] }
        t << [:b, 1]
        sleep 0
        t << [:b, 2]
      end
      Fiber.schedule { t << [:c, 0]; sleep 0; t << [:c, 1] }
    end
  end

  # Inside the running loop, a fiber that starts another goes on as soon as that one waits, before
  # the fibers that were ready already (an accept loop takes its next connection at once). Ruby's
  # semantics (its reference scheduler resumes the new fiber), so the pure-Ruby loop keeps it too.
  def test_a_fiber_that_starts_another_goes_on_before_the_fibers_already_ready
    expected = [[:a, 0], [:a, 1], [:p, 0], [:child, 0], [:p, 1], [:a, 2], [:child, 1]]
    ruby = assert_trace(expected) do |t|
      Fiber.schedule { 3.times { |i| t << [:a, i]; sleep 0 } }
      Fiber.schedule do
        sleep 0
        t << [:p, 0]
        Fiber.schedule { t << [:child, 0]; sleep 0; t << [:child, 1] }
        t << [:p, 1]
      end
    end
    at = ruby.index([:p, 0])
    assert_equal [[:p, 0], [:child, 0], [:p, 1]], ruby[at, 3], "on the pure-Ruby loop, the starter waited behind others"
  end

  def test_timers_fire_by_deadline_and_equal_durations_in_the_order_they_were_set
    expected = [[:io_wait, nil], [:sleep], [:block, false], [:pop, nil], [:select, nil], [:long_sleep]]
    assert_trace(expected) do |t|
      r, = pipe
      queue = Thread::Queue.new
      Fiber.schedule { sleep 0.06; t << [:long_sleep] }
      Fiber.schedule { t << [:pop, queue.pop(timeout: 0.04)] }
      Fiber.schedule { t << [:io_wait, r.wait_readable(0.02)] }
      Fiber.schedule { sleep 0.02; t << [:sleep] }
      Fiber.schedule { t << [:block, Fiber.scheduler.block(nil, 0.02)] }
      Fiber.schedule { t << [:select, IO.select([r], nil, nil, 0.04)] }
    end
  end

  # Timers due together fire in one pass, in deadline order: a waiter's timer readies its fiber, a
  # timeout's raises in its fiber there and then, before the ready fibers run.
  def test_a_due_timeout_raises_in_its_fiber_before_the_ready_fibers_run
    expected = [[:timeout, [:raised, Timeout::Error, "execution expired"]], [:sleeper, :woke]]
    assert_trace(expected) do |t|
      Fiber.schedule { sleep 0.01; t << [:sleeper, :woke] }
      Fiber.schedule { t << [:timeout, outcome { Timeout.timeout(0.02) { sleep 10 } }] }
      # Not a synchronisation: both deadlines pass before the loop next looks at its timers.
      due = monotonic + 0.02
      sleep 0.001 while monotonic <= due
    end
  end

  # Two timeouts due in one pass: each raises in its fiber in turn, and the first fiber, ready again
  # by then (sleep 0), keeps its place in the ready queue behind w, which yields round by round. (The
  # loop must know which fiber it raised into: taking the first for one that switched to the second
  # would ready it out of turn.)
  def test_timeouts_due_together_raise_in_turn_and_keep_the_ready_order
    expected = [[:w, 0], [:w, 1], [:x, [:raised, Timeout::Error, "execution expired"]],
                [:y, [:raised, Timeout::Error, "execution expired"]], [:w, 2], [:x, 1], [:w, 3], [:x, 2]]
    assert_trace(expected) do |t|
      Fiber.schedule do
        t << [:x, outcome { Timeout.timeout(0.01) { sleep 10 } }]
        sleep 0
        t << [:x, 1]
        sleep 0
        t << [:x, 2]
      end
      Fiber.schedule { t << [:y, outcome { Timeout.timeout(0.02) { sleep 10 } }] }
      Fiber.schedule { 4.times { |i| t << [:w, i]; sleep 0 } }
      due = monotonic + 0.02 # not a synchronisation: both deadlines pass before the loop runs
      sleep 0.001 while monotonic <= due
    end
  end

  # A timeout whose block ended, and a sleep ended by an unblock, leave no timer behind: the next,
  # longer waits of those fibers last past c's shorter sleep.
  def test_timers_removed_before_they_are_due_never_fire
    expected = [[:c, :unblocked], [:a, [:returned, :done]], [:b, [:returned, :slept]], [:c, :slept],
                [:a, [:returned, :slept]], [:b, [:returned, :slept]]]
    assert_trace(expected) do |t|
      Fiber.schedule do
        t << [:a, outcome { Timeout.timeout(0.02) { sleep 0; :done } }]
        t << [:a, outcome { sleep 0.06; :slept }]
      end
      b = Fiber.schedule do
        t << [:b, outcome { sleep 0.02; :slept }]
        t << [:b, outcome { sleep 0.06; :slept }]
      end
      Fiber.schedule do
        Fiber.scheduler.unblock(nil, b)
        t << [:c, :unblocked]
        sleep 0.04
        t << [:c, :slept]
      end
    end
  end

  # ---- block and unblock ---------------------------------------------------------------------------

  def test_block_and_unblock_with_and_without_timeouts
    expected = [[:d, :locked], [:push], [:unblocker], [:d, :unlocking], [:pop, :first], [:blocked, true],
                [:sleeper, :woke], [:e, :locked], [:block, false], [:pop, nil], [:cv, :timed_out]]
    assert_trace(expected) do |t|
      queue = Thread::Queue.new
      mutex = Thread::Mutex.new
      cv_mutex = Thread::Mutex.new
      cv = Thread::ConditionVariable.new
      Fiber.schedule { t << [:pop, queue.pop(timeout: 0.04)] } # gets :first
      Fiber.schedule { t << [:pop, queue.pop(timeout: 0.04)] } # times out
      Fiber.schedule { t << [:block, Fiber.scheduler.block(nil, 0.02)] }
      blocked = Fiber.schedule { t << [:blocked, Fiber.scheduler.block(nil, 10)] }
      sleeper = Fiber.schedule { sleep; t << [:sleeper, :woke] }
      Fiber.schedule { mutex.synchronize { t << [:d, :locked]; sleep 0; t << [:d, :unlocking] } }
      Fiber.schedule { mutex.synchronize { t << [:e, :locked] } }
      Fiber.schedule do
        cv_mutex.synchronize do
          cv.wait(cv_mutex, 0.06)
          t << [:cv, :timed_out]
        end
      end
      Fiber.schedule { queue << :first; t << [:push] }
      Fiber.schedule do
        Fiber.scheduler.unblock(nil, blocked)
        Fiber.scheduler.unblock(nil, sleeper)
        t << [:unblocker]
      end
    end
  end

  # An unblock for the fiber that runs (it has not blocked yet) is kept for its next block, which
  # ends at once; any other wait in between drops it.
  def test_an_unblock_for_the_running_fiber_is_kept_for_its_next_block
    expected = [[:kept, true], [:dropped, false]]
    assert_trace(expected) do |t|
      Fiber.schedule do
        Fiber.scheduler.unblock(nil, Fiber.current)
        t << [:kept, Fiber.scheduler.block(nil, 0.05)]
        Fiber.scheduler.unblock(nil, Fiber.current)
        sleep 0
        t << [:dropped, Fiber.scheduler.block(nil, 0.02)]
      end
    end
  end

  # ---- io_select ----------------------------------------------------------------------------------

  def test_io_select_gives_the_ready_objects_of_each_array
    expected = [[:now, [[], [:w1], []]], [:buffered, [[:r3], [], []]], [:wrote],
                [:later, [[:r2], [], []]], [:timed_out, nil]]
    assert_trace(expected) do |t|
      r1, w1 = pipe
      r2, w2 = pipe
      r3, w3 = pipe
      full_r, full_w = pipe
      fill(full_w)
      w3.write("ab")
      r3.getc # "b" stays in r3's buffer, the pipe is empty: IO.select counts r3 as readable
      names = {r1 => :r1, w1 => :w1, r2 => :r2, w2 => :w2, r3 => :r3, full_r => :full_r, full_w => :full_w}
      name = ->(result) { result&.map { |set| set.map { |io| names.fetch(io) } } }
      Fiber.schedule { t << [:now, name.(IO.select([r1, r2], [w1, full_w], nil, 0))] }
      Fiber.schedule { t << [:later, name.(IO.select([r1, r2], [full_w], [r1], 10))] }
      Fiber.schedule { t << [:timed_out, name.(IO.select([r1], [full_w], nil, 0.02))] }
      Fiber.schedule { t << [:buffered, name.(IO.select([r3], nil, nil, 10))] }
      Fiber.schedule { w2.write("x"); t << [:wrote] }
    end
  end

  # ---- IO#close while fibers wait ---------------------------------------------------------------

  # Ruby 4.0's close interrupts the fibers waiting on the IO itself (fiber_interrupt, the last to
  # begin waiting first) and returns once they have left their waits; 3.3 and 3.4 leave it to evt,
  # which wakes them and lets the closer go on first.
  RUBY_INTERRUPTS = RUBY_VERSION >= "4"

  def test_waiters_on_a_closed_io_raise_and_the_others_keep_waiting
    expected = if RUBY_INTERRUPTS
                 [[:closer, :closing], [:wait, closed], [:read, closed], [:gets, closed], [:select, closed],
                  [:closer, :closed], [:other, [:returned, "x"]]]
               else
                 [[:closer, :closing], [:closer, :closed], [:read, closed], [:wait, closed], [:select, closed],
                  [:gets, closed], [:other, [:returned, "x"]]]
               end
    assert_trace(expected) do |t|
      r, = pipe
      other_r, other_w = pipe
      a, b = UNIXSocket.pair
      ios.push(a, b)
      Fiber.schedule { t << [:read, outcome { r.read(1) }] }
      Fiber.schedule { t << [:wait, outcome { r.wait_readable }] }
      Fiber.schedule { t << [:select, outcome { IO.select([other_r, r]) }] }
      Fiber.schedule { t << [:gets, outcome { a.gets }] }
      Fiber.schedule { t << [:other, outcome { other_r.read(1) }] }
      Fiber.schedule do
        t << [:closer, :closing]
        r.close
        a.close
        t << [:closer, :closed]
        other_w.write("x")
      end
    end
  end

  # The close flushes a buffered write to a full pipe, and waits for room: the fiber waiting on the
  # same IO has been told already (C wakes waiters before the close begins), and raises while the
  # closer still waits.
  def close_while_flushing(how)
    expected = [[:closer, :closing], [:drainer, false], [:waiter, closed], [:closer, :closed]]
    assert_trace(expected) do |t|
      r, w = pipe
      fill(w)
      w.sync = false
      w.write("tail") # buffered: the close writes it
      Fiber.schedule { t << [:waiter, outcome { w.wait_writable }] }
      Fiber.schedule do
        t << [:closer, :closing]
        w.public_send(how)
        t << [:closer, :closed]
      end
      Fiber.schedule do
        t << [:drainer, w.closed?]
        drain(r)
      end
    end
  end

  def test_close_tells_the_waiters_before_it_flushes
    close_while_flushing(:close)
  end

  def test_close_write_tells_the_waiters_before_it_flushes
    close_while_flushing(:close_write)
  end

  def test_close_read_of_a_pipe_wakes_its_readers
    expected = RUBY_INTERRUPTS ? [[:reader, closed], [:closer, :closed]] : [[:closer, :closed], [:reader, closed]]
    assert_trace(expected) do |t|
      r, = pipe
      Fiber.schedule { t << [:reader, outcome { r.read(1) }] }
      Fiber.schedule { r.close_read; t << [:closer, :closed] }
    end
  end

  # A socket's close_read and close_write shut it down instead of closing it: nobody is woken as
  # closed; the readers see end of file, or their data. Sockets have methods of their own
  # (BasicSocket's); a plain IO on a socket's descriptor goes through IO#close_read and #close_write,
  # which both loops intercept.
  def test_close_read_and_close_write_of_a_socket_shut_it_down
    expected = [[:shut], [:peer, [:returned, nil]], [:peer, :wrote],
                [:socket, [:returned, nil]], [:io, [:returned, nil]],
                [:socket, [:returned, "y"]], [:io, [:returned, "z"]]]
    assert_trace(expected) do |t|
      # Made, waited on and woken in one order: the backends dispatch events that come together in
      # orders of their own.
      pairs = Array.new(4) { UNIXSocket.pair }
      ios.concat(pairs.flatten)
      read_shut, io_read_shut, write_shut, io_write_shut = pairs.map(&:first)
      plain = [io_read_shut, io_write_shut].map { |socket| IO.for_fd(socket.fileno, autoclose: false) }
      ios.concat(plain)
      Fiber.schedule { t << [:socket, outcome { read_shut.read(1) }] }
      Fiber.schedule { t << [:io, outcome { plain[0].read(1) }] }
      Fiber.schedule { t << [:socket, outcome { write_shut.read(1) }] }
      Fiber.schedule { t << [:io, outcome { plain[1].read(1) }] }
      Fiber.schedule do
        read_shut.close_read
        plain[0].close_read
        write_shut.close_write
        plain[1].close_write
        t << [:shut]
        t << [:peer, outcome { pairs[2][1].read_nonblock(1, exception: false) }]
        pairs[2][1].write_nonblock("y")
        pairs[3][1].write_nonblock("z")
        t << [:peer, :wrote]
      end
    end
  end

  # IO.popen's "r+" IO writes through an IO of its own, where writers wait: closing the IO wakes them.
  def test_close_of_a_popen_io_wakes_the_writers_on_its_write_side
    expected = [[:closer, :closing], [:writer, closed, true]]
    assert_trace(expected) do |t|
      io = IO.popen(["yes"], "r+") # never reads what it is sent: the pipe stays full
      ios << io
      fill(io)
      Fiber.schedule { t << [:writer, outcome { io.write("more") }, io.closed?] }
      Fiber.schedule do
        t << [:closer, :closing]
        io.close # yes ends on SIGPIPE; waiting for it may or may not suspend the closer
      end
    end
  end

  # Another thread closes the IO while the loop waits in the kernel: the waiter raises; the thread's
  # end wakes the fiber that joins it.
  def test_close_from_another_thread
    expected = RUBY_INTERRUPTS ? [[:reader, closed], [:joined]] : [[:joined], [:reader, closed]]
    assert_trace(expected) do |t|
      r, = pipe
      Fiber.schedule { t << [:reader, outcome { r.read(1) }] }
      Fiber.schedule { Thread.new { r.close }.join; t << [:joined] }
    end
  end
end
