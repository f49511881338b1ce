# frozen_string_literal: true

require "test_helper"
require "timeout"
require "tempfile"
require "delegate"

# The hooks beyond the core: io_pread/io_pwrite, io_select, timeout_after, process_wait,
# address_resolve, each with bad input giving the error Ruby gives without a scheduler.
class HooksTest < Minitest::Test
  # Runs the block while a fiber ticks whenever the loop runs: the count shows the block let the
  # other fibers run.
  def ticks_during
    ticks = 0
    running = true
    Fiber.schedule do
      while running
        ticks += 1
        sleep 0
      end
    end
    yield
    ticks
  ensure
    running = false
  end

  def test_pread_and_pwrite_on_a_file
    Dir.mktmpdir do |dir|
      evt do
        File.open(File.join(dir, "data"), "w+") do |file|
          assert_equal 5, file.pwrite("hello", 0)
          assert_equal 5, file.pwrite("world", 10)
          assert_equal "hello", file.pread(5, 0)
          assert_equal "world", file.pread(5, 10)
          assert_equal 0, file.pos, "pread and pwrite leave the position"
        end
      end
    end
  end

  # Ruby 3.3 and 3.4 call io_pwrite without the GVL (IO#pwrite's blocking region): a hook that
  # suspended the fiber there broke Ruby's thread scheduler, and threads made later hung.
  def test_pwrite_in_a_fiber_leaves_threads_working
    Dir.mktmpdir do |dir|
      evt do
        3.times { |i| Fiber.schedule { File.open(File.join(dir, "f#{i}"), "w") { |f| f.pwrite("data", 0) } } }
      end
      assert_equal [:joined] * 3, Array.new(3) { Thread.new { sleep 0.01 }.join && :joined }
      assert_equal "data", File.read(File.join(dir, "f0"))
    end
  end

  # IO::Buffer#pread, #pwrite, #read and #write pass the hooks the object they were given, which
  # may only wrap an IO (a Tempfile, a delegator): the hooks work on its IO, as Ruby does without a
  # scheduler. (Ruby's own test_io_buffer_pread_pwrite read zeros here, and the same call through a
  # Tempfile crashed the VM.)
  def test_io_buffer_transfers_through_an_object_wrapping_an_io
    message = IO::Buffer.for("Hello World!")
    read_back = piped = nil
    Tempfile.create("evt") do |file|
      wrapped = SimpleDelegator.new(file)
      evt do
        assert_equal message.size, message.pwrite(wrapped, 1, message.size)
        destination = IO::Buffer.new(message.size)
        assert_equal message.size, destination.pread(wrapped, 1, message.size)
        read_back = destination.get_string
        r, w = IO.pipe
        Fiber.schedule do
          buffer = IO::Buffer.new(message.size)
          buffer.read(SimpleDelegator.new(r), message.size)
          piped = buffer.get_string
        end
        Fiber.schedule { message.write(SimpleDelegator.new(w), message.size) }
      end
    end
    assert_equal "Hello World!", read_back
    assert_equal "Hello World!", piped
  end

  def test_pread_on_a_pipe_raises_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.pread(1, 0) }
    evt do
      r, = IO.pipe
      error = assert_raises(expected.class) { r.pread(1, 0) }
      assert_equal expected.message, error.message
    end
  end

  def test_pread_with_a_negative_offset_raises_as_ruby_does
    Dir.mktmpdir do |dir|
      path = File.join(dir, "data")
      File.write(path, "data")
      expected = error_without_scheduler { File.open(path) { |f| f.pread(1, -1) } }
      evt do
        File.open(path) do |file|
          error = assert_raises(expected.class) { file.pread(1, -1) }
          assert_equal expected.message, error.message
        end
      end
    end
  end

  def test_pread_and_pwrite_on_a_closed_io_raise_as_ruby_does
    Dir.mktmpdir do |dir|
      path = File.join(dir, "data")
      File.write(path, "data")
      [->(f) { f.pread(1, 0) }, ->(f) { f.pwrite("x", 0) }].each do |call|
        expected = error_without_scheduler { call.call(File.open(path, "r+").tap(&:close)) }
        evt do
          error = assert_raises(expected.class) { call.call(File.open(path, "r+").tap(&:close)) }
          assert_equal expected.message, error.message
        end
      end
    end
  end

  def test_io_wait_with_a_non_numeric_timeout_raises_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.wait_readable("1") }
    evt do
      error = assert_raises(expected.class) { IO.pipe.first.wait_readable("1") }
      assert_equal expected.message, error.message
    end
  end

  def test_io_select_wakes_on_the_first_ready_io_and_lets_other_fibers_run
    result = ticks = nil
    evt do
      r1, w1 = IO.pipe # w1 kept: collected, it would close and make r1 readable (end of file)
      r2, w2 = IO.pipe
      Fiber.schedule do
        sleep 0.02
        w2.write("x")
      end
      ticks = ticks_during { result = IO.select([r1, r2], nil, nil, 5) }
      assert_equal [[r2], [], []], result
      w1.close
    end
    assert_operator ticks, :>, 0
  end

  def test_io_select_returns_every_ready_io_of_each_kind
    evt do
      r1, w1 = IO.pipe
      r2, w2 = IO.pipe
      w1.write("a")
      w2.write("b")
      readable, writable, exceptional = IO.select([r1, r2], [w1], [r1], 1)
      assert_equal [r1, r2], readable
      assert_equal [w1], writable
      assert_equal [], exceptional
    end
  end

  def test_io_select_counts_data_in_the_read_buffer
    evt do
      r, w = IO.pipe
      w.write("line one\nline two\n")
      assert_equal "line one\n", r.gets # the second line now waits in r's buffer, not the pipe
      assert_equal [[r], [], []], IO.select([r], nil, nil, 0)
    end
  end

  def test_io_select_times_out_with_nil
    result = :unset
    time = elapsed { evt { result = IO.select([IO.pipe.first], nil, nil, 0.05) } }
    assert_nil result
    assert_operator time, :>=, 0.05
  end

  def test_io_select_accepts_objects_with_to_io_and_returns_them
    wrapper = Struct.new(:to_io)
    evt do
      r, w = IO.pipe
      w.write("x")
      given = wrapper.new(r)
      assert_equal [[given], [], []], IO.select([given], nil, nil, 1)
    end
  end

  def test_io_select_with_nothing_to_watch_sleeps_for_the_timeout
    time = elapsed { evt { assert_nil IO.select([], [], [], 0.03) } }
    assert_operator time, :>=, 0.03
  end

  def test_io_select_bad_input_raises_as_ruby_does
    closed = IO.pipe.first.tap(&:close)
    cases = {
      "a closed IO" => -> { IO.select([closed], nil, nil, 0) },
      "a non-array" => -> { IO.select(IO.pipe.first, nil, nil, 0) },
      "a non-IO element" => -> { IO.select([42], nil, nil, 0) },
      "a negative timeout" => -> { IO.select([IO.pipe.first], nil, nil, -1) },
      "a non-numeric timeout" => -> { IO.select([IO.pipe.first], nil, nil, "1") },
    }
    cases.each do |what, call|
      expected = error_without_scheduler(&call)
      evt do
        error = assert_raises(expected.class, what, &call)
        assert_equal expected.message, error.message, what
      end
    end
  end

  def test_timeout_raises_in_a_waiting_fiber_and_others_run
    error = ticks = nil
    evt do
      ticks = ticks_during do
        error = assert_raises(Timeout::Error) { Timeout.timeout(0.03) { sleep 5 } }
      end
    end
    assert_equal "execution expired", error.message
    assert_operator ticks, :>, 0
  end

  # Timeouts due at the same turn of the loop, in fibers each waiting on a read: each gets its own
  # Timeout::Error. (On io_uring the second raise used to ready the first fiber in the middle of its
  # next read, which it then cancelled itself: Errno::ECANCELED.)
  def test_timeouts_due_together_each_raise_timeout_error
    outcomes = Hash.new(0)
    evt do
      3.times do
        Fiber.schedule do
          r, w = IO.pipe
          40.times do
            Timeout.timeout(0.002) { r.read(1) }
            outcomes[:read] += 1
          rescue Timeout::Error
            outcomes[:timeout] += 1
          rescue StandardError => e
            outcomes[e.class] += 1
          end
        ensure
          r&.close
          w&.close
        end
      end
    end
    assert_equal({timeout: 120}, outcomes)
  end

  def test_timeout_gives_the_block_value_when_it_finishes_first
    evt { assert_equal :done, Timeout.timeout(5) { :done } }
  end

  def test_a_finished_timeout_leaves_no_timer_behind
    time = elapsed { evt { Timeout.timeout(5) { sleep 0.001 } } }
    assert_operator time, :<, 2, "a leftover 5 s timer would keep the loop alive"
  end

  def test_nested_timeouts
    evt do
      inner = assert_raises(Timeout::Error) { Timeout.timeout(5) { Timeout.timeout(0.02) { sleep 5 } } }
      assert_equal "execution expired", inner.message
      outer = Class.new(StandardError)
      assert_raises(outer) { Timeout.timeout(0.02, outer) { Timeout.timeout(5) { sleep 5 } } }
    end
  end

  def test_timeout_with_a_class_and_message
    custom = Class.new(StandardError)
    evt do
      error = assert_raises(custom) { Timeout.timeout(0.01, custom, "too slow") { sleep 5 } }
      assert_equal "too slow", error.message
    end
  end

  def test_timeout_interrupts_io
    evt do
      r, = IO.pipe
      assert_raises(Timeout::Error) { Timeout.timeout(0.02) { r.read(1) } }
    end
  end

  def test_timeout_after_with_a_non_numeric_duration_raises_as_sleep_does
    expected = error_without_scheduler { sleep("1") }
    evt do
      error = assert_raises(expected.class) { Fiber.scheduler.timeout_after("1", Timeout::Error, "x") { nil } }
      assert_equal expected.message, error.message
    end
  end

  # Ruby 3.4's timeout gem refuses a negative duration; 3.3's treats it as already expired (a block
  # that waits is interrupted, one that does not finishes). Whichever this Ruby does, evt does too.
  def test_a_negative_timeout_behaves_as_without_a_scheduler
    outcome = lambda do |&block|
      Timeout.timeout(-1, &block)
    rescue StandardError => e
      e.class
    end
    expected = [outcome.call { :ran }, outcome.call { sleep 0.01 }]
    actual = nil
    evt { actual = [outcome.call { :ran }, outcome.call { sleep 0.01 }] }
    assert_equal expected, actual
  end

  def test_process_wait_lets_other_fibers_run
    status = ticks = nil
    evt do
      pid = Process.spawn("sleep 0.05")
      ticks = ticks_during { _, status = Process.wait2(pid) }
    end
    assert status.success?
    assert_operator ticks, :>, 0
  end

  # io_uring (waitid in the ring) and kqueue (EVFILT_PROC, NOTE_EXIT) watch a child themselves: the
  # wait ends when it exits, and leaves it for Ruby to reap. A wait given up (a timeout) takes its
  # watch back (a report of it afterwards would be written into a frame that is gone: ASan's to
  # see); two waits for one child both end.
  def test_the_backend_watches_a_child_itself_where_it_can
    evt do
      scheduler = Fiber.scheduler
      pid = Process.spawn("sleep 0.05")
      exited = scheduler.__send__(:wait_child_exit, pid)
      if exited.nil?
        Process.wait(pid)
        skip "the #{scheduler.backend} backend cannot watch a process here"
      end
      assert_equal true, exited
      # Exited, and left to be reaped (a BSD may report the exit just before the child is a zombie).
      deadline = monotonic + 5
      reaped = Process.wait(pid, Process::WNOHANG) until reaped || monotonic > deadline
      assert_equal pid, reaped

      pid = Process.spawn("sleep 0.1")
      assert_raises(Timeout::Error) { Timeout.timeout(0.02) { scheduler.__send__(:wait_child_exit, pid) } }
      assert_equal pid, Process.wait(pid)

      pid = Process.spawn("sleep 0.05")
      both = Array.new(2) { Fiber.schedule { scheduler.__send__(:wait_child_exit, pid) } }
      sleep 0.001 while both.any?(&:alive?)
      assert_equal pid, Process.wait(pid)
    end
  end

  def test_process_wait_for_any_child
    status = ticks = nil
    evt do
      pid = Process.spawn("sh", "-c", "sleep 0.05; exit 3")
      ticks = ticks_during { status = Process::Status.wait(-1, 0) }
      assert_equal pid, status.pid
    end
    assert_equal 3, status.exitstatus
    assert_operator ticks, :>, 0
  end

  def test_process_wait_with_wnohang
    evt do
      pid = Process.spawn("sleep 0.05")
      assert_nil Process.wait(pid, Process::WNOHANG)
      assert_equal pid, Process.wait(pid)
    end
  end

  def test_process_wait_for_a_pid_that_is_not_a_child_raises_as_ruby_does
    expected = error_without_scheduler { Process.wait(999_999) }
    evt do
      error = assert_raises(expected.class) { Process.wait(999_999) }
      assert_equal expected.message, error.message
    end
  end

  def test_address_resolve_lets_other_fibers_run
    addresses = ticks = nil
    evt { ticks = ticks_during { addresses = Addrinfo.getaddrinfo("localhost", 80, nil, :STREAM).map(&:ip_address) } }
    assert_includes addresses, "127.0.0.1"
    assert_operator ticks, :>, 0
  end

  def test_address_resolve_of_literals_and_zones
    evt do
      scheduler = Fiber.scheduler
      assert_equal ["127.0.0.1"], scheduler.address_resolve("127.0.0.1")
      assert_equal ["::1"], scheduler.address_resolve("::1")
      assert_equal ["::1"], scheduler.address_resolve("::1%lo"), "the zone cannot come through Ruby's numeric parse"
      assert_includes scheduler.address_resolve("localhost%lo"), "127.0.0.1"
    end
  end

  def test_an_unknown_host_raises_as_ruby_does
    expected = error_without_scheduler { Addrinfo.getaddrinfo("nonexistent.invalid", 80) }
    evt do
      error = assert_raises(expected.class) { Addrinfo.getaddrinfo("nonexistent.invalid", 80) }
      assert_equal expected.message, error.message
      assert_kind_of Socket::ResolutionError, error
    end
  end

  def test_resolution_works_after_fork
    report = nil
    evt do
      Addrinfo.getaddrinfo("localhost", 80) # the resolver's threads start in the parent
      r, w = IO.pipe
      pid = fork do
        r.close
        w.write(Addrinfo.getaddrinfo("localhost", 80, nil, :STREAM).map(&:ip_address).include?("127.0.0.1").to_s)
        w.close
        exit!(0)
      end
      w.close
      report = r.read
      Process.wait(pid)
    end
    assert_equal "true", report
  end

  # Records what reaches io_write, then lets evt's own do it.
  class WriteRecorder < Evt::Scheduler
    def writes
      @writes ||= []
    end

    def io_write(io, buffer, *arguments)
      writes << buffer.get_string
      super
    end
  end

  # Ruby 4.0 flushes an IO's buffered data through io_write (ruby/ruby#15609); 3.3 and 3.4 write it
  # themselves, waiting for room through io_wait. Either way a flush into a full pipe waits in the
  # loop while the other fibers run (one drains the pipe here), and the data arrives whole.
  def test_a_flush_into_a_full_pipe_waits_in_the_loop
    r, w = IO.pipe
    loop { break if w.write_nonblock("f" * 65_536, exception: false) == :wait_writable }
    w.sync = false
    scheduler = WriteRecorder.new
    order = []
    drained = +""
    Timeout.timeout(10) do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        w.write("tail") # buffered
        w.flush
        order << :flushed
        w.close
      end
      Fiber.schedule do
        order << :other
        drained << r.read
      end
    ensure
      Fiber.set_scheduler(nil)
    end
    assert_equal %i[other flushed], order
    assert drained.end_with?("tail"), "the flushed data arrived"
    assert_includes scheduler.writes, "tail", "Ruby 4.0 flushes through io_write" if RUBY_VERSION >= "4"
  ensure
    [r, w].each { |io| io&.close unless io&.closed? }
  end

  # Ruby 4.0's yield hook (Ruby calls it when a signal comes while a fiber is in a blocking
  # operation), which Async's and Itsi's schedulers also offer, and Itsi's server calls
  # (test/itsi_test.rb). As sleep(0): the other ready fibers run first.
  def test_yield_lets_the_other_ready_fibers_run_then_carries_on
    order = []
    evt do
      Fiber.schedule do
        sleep 0
        order << :other
      end
      assert_nil Fiber.scheduler.yield
      order << :yielder
    end
    assert_equal %i[other yielder], order
  end

  # Itsi yields for as long as requests are queued: the fibers waiting for I/O must get theirs.
  def test_a_fiber_yielding_in_a_loop_leaves_the_fibers_waiting_for_io_their_events
    got = nil
    evt do
      reader, writer = IO.pipe
      Fiber.schedule { got = reader.read(5) }
      writer.write("hello")
      Fiber.scheduler.yield until got
    ensure
      reader&.close
      writer&.close
    end
    assert_equal "hello", got
  end
end
