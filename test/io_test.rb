# frozen_string_literal: true

require "test_helper"
require "io/nonblock"
require "io/wait"
require "support/io_helpers"

# io_read and io_write between fibers on pipes, TCP and UNIX sockets and files.
class IOTest < Minitest::Test
  include IOHelpers

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

  # Ruby's own read path under a scheduler without transfer hooks (3.3 to 4.0) raises
  # IO::TimeoutError here: fiber A's read runs out its IO#timeout and leaves errno at ETIMEDOUT; B's
  # read of another pipe, woken later without a system call of Ruby's between, succeeds, and Ruby
  # takes the stale errno for its own (docs/behaviour.md, "A read after another fiber's IO#timeout").
  # evt's transfer hooks, on both loops, read and write themselves.
  def test_a_read_after_another_fibers_io_timeout_returns_its_data
    outcomes = []
    pipes = [IO.pipe, IO.pipe]
    (a, _), (b, b_writer) = pipes
    a_ended = Thread::Queue.new
    # Another thread writes B's byte once A has timed out: this thread's errno is left as A left it.
    writer = Thread.new { a_ended.pop && b_writer.write("x") }
    evt do
      a.timeout = 0.01
      Fiber.schedule do
        a.read(1)
      rescue IO::TimeoutError
        outcomes << :a_timed_out
      ensure
        a_ended << true
      end
      Fiber.schedule do
        outcomes << b.read(1)
      rescue IO::TimeoutError => e
        outcomes << e
      end
    end
    assert_equal [:a_timed_out, "x"], outcomes
  ensure
    writer&.join
    pipes&.flatten&.each(&:close)
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

  # Where a read that must wait waits. On Ruby 4.0 with a backend that waits for readiness, a read
  # Ruby tries again itself after EAGAIN (gets, read, readpartial) is handed EAGAIN by io_read and
  # waits in io_wait, from higher up Ruby's read path: 4.0's frames around io_read would cost the
  # waiting fiber a second page of stack (docs/benchmarks.md). On io_uring only IO#read is, the
  # deepest: the others fit a page with the ring's read. Elsewhere a read waits inside io_read, as
  # sysread does (it does not try again). Ruby 4.1's io_read hands every read back. What it reads is
  # the same.
  def test_where_a_read_that_must_wait_waits
    hooks = {}
    read = {}
    handed_back = single = nil
    evt do
      single = (SELECT ? Evt::SelectLoop::INTERFACE : Evt::Loop::FIBER_SCHEDULER_VERSION) >= 4
      # Ruby 4.0 with the extension: every reader that tries again itself, or only IO#read where the
      # ring reads (io_uring)
      handed_back = if single then %i[gets read readpartial]
                    elsif SELECT || !RUBY_VERSION.start_with?("4.0") then []
                    elsif Fiber.scheduler.backend == :io_uring then %i[read]
                    else %i[gets read readpartial]
                    end
      readers = {
        gets: ->(io) { io.gets }, read: ->(io) { io.read(3) }, readpartial: ->(io) { io.readpartial(10) },
        sysread: ->(io) { io.sysread(10) }
      }
      readers.each do |name, reader|
        r, w = IO.pipe
        fiber = Fiber.schedule do
          read[name] = reader.call(r)
          r.close
        end
        Fiber.schedule do
          hooks[name] = fiber.backtrace.grep(/[`'](?:[^`']*#)?(io_read|io_wait)'/) { Regexp.last_match(1) }.uniq
          w.write("ab\n")
          w.close
        end
      end
    end
    assert_equal({ gets: "ab\n", read: "ab\n", readpartial: "ab\n", sysread: "ab\n" }, read)
    %i[gets read readpartial].each do |name|
      assert_equal [handed_back.include?(name) ? "io_wait" : "io_read"], hooks[name], "#{name}: #{hooks[name].inspect}"
    end
    assert_equal ["io_read"], hooks[:sysread] unless single
  end
end
