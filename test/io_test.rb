# frozen_string_literal: true

require "test_helper"
require "io/nonblock"
require "io/wait"

# io_wait, io_read and io_write on pipes, TCP and UNIX sockets and files.
class IOTest < Minitest::Test
  def test_pipe_between_fibers
    received = nil
    evt do
      r, w = IO.pipe
      Fiber.schedule { received = r.read }
      Fiber.schedule do
        sleep 0.01
        w.write("hello")
        w.close
      end
    end
    assert_equal "hello", received
  end

  def test_a_transfer_larger_than_the_pipe_suspends_and_resumes_the_writer
    data = Random.bytes(1 << 20)
    received = nil
    evt do
      r, w = IO.pipe
      r.binmode
      Fiber.schedule { received = r.read }
      Fiber.schedule do
        w.write(data)
        w.close
      end
    end
    assert_equal data, received
  end

  def test_a_reader_and_a_writer_wait_on_the_same_socket_at_once
    readable = writable = nil
    evt do
      a, b = UNIXSocket.pair
      fill(a)
      Fiber.schedule { readable = a.wait_readable(5) }
      Fiber.schedule { writable = a.wait_writable(5) }
      Fiber.schedule do
        b.write("x")
        drain(b)
      end
    end
    assert readable, "the reader waiting on the socket was not woken"
    assert writable, "the writer waiting on the same socket was not woken"
  end

  # Data already there is read at once, as a thread reads it: the fiber goes on without letting the
  # others run first (on io_uring such a read went through the ring: a fiber switch and a turn of
  # the loop for every read), on a pipe and on a socket.
  def test_a_read_of_data_already_there_returns_without_a_fiber_switch
    [IO.pipe, UNIXSocket.pair.reverse].each do |r, w|
      order = []
      evt do
        w.write("hello")
        Fiber.schedule do
          sleep 0 # ready, queued before the reader
          order << :other
        end
        Fiber.schedule { order << r.read(5) }
      end
      assert_equal ["hello", :other], order
    ensure
      r&.close
      w&.close
    end
  end

  def test_io_wait_returns_the_ready_events
    evt do
      r, w = IO.pipe
      assert_equal IO::WRITABLE, Fiber.scheduler.io_wait(w, IO::WRITABLE, 1)
      w.write("x")
      assert_equal IO::READABLE, Fiber.scheduler.io_wait(r, IO::READABLE | IO::PRIORITY, 1)
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

  def test_tcp_echo_with_many_clients
    replies = {}
    evt do
      server = TCPServer.new("127.0.0.1", 0)
      port = server.local_address.ip_port
      Fiber.schedule do
        20.times do
          client = server.accept
          Fiber.schedule do
            while (line = client.gets)
              client.write(line)
            end
            client.close
          end
        end
        server.close
      end
      20.times do |i|
        Fiber.schedule do
          socket = TCPSocket.new("127.0.0.1", port)
          socket.write("hello #{i}\n")
          replies[i] = socket.gets
          socket.close
        end
      end
    end
    assert_equal(20.times.to_h { |i| [i, "hello #{i}\n"] }, replies)
  end

  def test_unix_socket_server_and_client
    reply = nil
    Dir.mktmpdir do |dir|
      path = File.join(dir, "evt.sock")
      evt do
        server = UNIXServer.new(path)
        Fiber.schedule do
          client = server.accept
          client.write(client.gets.upcase)
          client.close
        end
        Fiber.schedule do
          socket = UNIXSocket.new(path)
          socket.puts("unix")
          reply = socket.read
        end
      end
    end
    assert_equal "UNIX\n", reply
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

  def test_io_buffer_read_with_a_minimum_length_waits_for_all_of_it
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        w.write("ab")
        sleep 0.01
        w.write("cd")
      end
      buffer = IO::Buffer.new(8)
      assert_equal 4, Fiber.scheduler.io_read(r, buffer, 4, 0)
      assert_equal "abcd", buffer.get_string(0, 4)
    end
  end

  # A write that can go through at once does, on every backend: a fiber suspended in its write holds
  # Ruby's write lock on the IO, so the root fiber's own write to it raised ThreadError ("deadlock;
  # lock already owned by another fiber") where io_uring sent every write, and every file write, to
  # the ring. A log file and a pipe written from fibers and from the thread's own code.
  def test_fibers_and_the_root_fiber_write_to_the_same_io
    Dir.mktmpdir do |dir|
      path = File.join(dir, "log")
      r, w = IO.pipe
      File.open(path, "w") do |log|
        log.sync = true
        Thread.new do
          Fiber.set_scheduler(Evt::Scheduler.new)
          Fiber.schedule do
            log.puts "fiber"
            w.puts "fiber"
          end
          log.puts "root"
          w.puts "root"
        end.join
      end
      w.close
      assert_equal "fiber\nroot\n", File.read(path)
      assert_equal "fiber\nroot\n", r.read
    ensure
      r&.close
      w&.close
    end
  end

  def test_end_of_file
    evt do
      r, w = IO.pipe
      w.write("last")
      w.close
      assert_equal "last", r.read(10)
      assert_nil r.read(10)
    end
  end

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

  def test_a_negative_io_wait_timeout_raises_as_ruby_does
    expected = error_without_scheduler { IO.pipe.first.wait_readable(-1) }
    evt do
      r, = IO.pipe
      error = assert_raises(expected.class) { r.wait_readable(-1) }
      assert_equal expected.message, error.message
    end
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
        r2, w2 = IO.pipe
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

  def test_regular_files_read_and_write
    Dir.mktmpdir do |dir|
      path = File.join(dir, "data")
      content = nil
      evt do
        File.write(path, "line one\nline two\n")
        File.open(path, "a") { |f| f.write("line three\n") }
        content = File.read(path)
      end
      assert_equal "line one\nline two\nline three\n", content
    end
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
      r2, w2 = IO.pipe
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
      r2, w2 = IO.pipe
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

  private

  def fill(socket)
    loop { socket.write_nonblock("x" * 65_536) }
  rescue IO::WaitWritable
    nil
  end

  def drain(socket)
    socket.read_nonblock(1 << 20) while socket.wait_readable(0.05)
  rescue IO::WaitReadable, EOFError
    nil
  end
end
