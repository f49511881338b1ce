# frozen_string_literal: true

require "test_helper"
require "rbconfig"

# Fault: the process runs out of descriptors (EMFILE). The fiber whose call needs a descriptor gets
# Errno::EMFILE, as it would without a scheduler; the loop and every other fiber go on, since evt
# itself needs no new descriptor to wait; once descriptors are freed, the same call works again;
# and nothing leaks.
class FaultEmfileTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)

  def evt(timeout: 10, &block)
    super
  end

  # Lowers the soft limit to a few above what is open and takes the rest, so the next descriptor the
  # process asks for gets EMFILE; frees them and restores the limit afterwards, whatever happens.
  def out_of_descriptors
    soft, hard = Process.getrlimit(:NOFILE)
    hog = []
    Process.setrlimit(:NOFILE, open_descriptors + 8, hard)
    begin
      loop { hog << File.open(File::NULL) }
    rescue Errno::EMFILE
      nil
    end
    yield
  ensure
    hog.each(&:close)
    Process.setrlimit(:NOFILE, soft, hard)
  end

  def test_accept_raises_emfile_other_fibers_go_on_and_accept_works_once_freed
    expected = error_without_scheduler do
      reference = TCPServer.new("127.0.0.1", 0)
      client = Socket.tcp("127.0.0.1", reference.local_address.ip_port)
      out_of_descriptors { reference.accept }
    ensure
      [reference, client].each { |io| io&.close }
    end
    assert_instance_of Errno::EMFILE, expected

    server = TCPServer.new("127.0.0.1", 0)
    near, far = UNIXSocket.pair
    before = descriptor_table
    outcomes = Thread::Queue.new
    freed = Thread::Queue.new
    echoed = ticks_while_full = accepted_reply = nil
    evt do
      ticks = 0
      running = true
      Fiber.schedule do
        while running
          sleep 0.002
          ticks += 1
        end
      end
      # An echo over a connection that already exists.
      Fiber.schedule do
        while (line = near.gets)
          near.write(line)
        end
      end
      # The acceptor: waiting in accept when the connection arrives with the table full.
      Fiber.schedule do
        outcomes << server.accept
      rescue SystemCallError => e
        outcomes << e
        freed.pop
        connection = server.accept # the same pending connection, once descriptors are back
        connection.write(connection.read(5).upcase)
        connection.close
      end

      client = Socket.new(:INET, :STREAM) # made before the table fills; connected after
      out_of_descriptors do
        client.connect(server.local_address)
        outcomes << outcomes.pop # the acceptor's outcome, for after the run
        started = ticks
        sleep 0.001 until ticks >= started + 3 # the timer fiber goes on
        ticks_while_full = ticks - started
        far.write("ping\n")
        echoed = far.gets
      end
      freed << true
      client.write("hello")
      accepted_reply = client.read(5)
      client.close
      running = false
      far.close
    end
    error = outcomes.pop
    assert_instance_of expected.class, error, "the acceptor must get the error Ruby raises without a scheduler"
    assert_operator ticks_while_full, :>=, 3
    assert_equal "ping\n", echoed
    assert_equal "HELLO", accepted_reply
    near.close
    assert_no_descriptor_leaked before
  ensure
    server&.close
  end

  # Many fibers find the table full at once: each gets its own EMFILE, none is lost or stuck.
  def test_every_fiber_that_needs_a_descriptor_gets_emfile_while_waiters_stay_intact
    pipes = Array.new(20) { IO.pipe }
    before = descriptor_table
    received = Array.new(pipes.size)
    errors = []
    evt do
      pipes.each_with_index { |(r, _), i| Fiber.schedule { received[i] = r.read(6) } }
      out_of_descriptors do
        fibers = Array.new(10) do
          Fiber.schedule do
            sleep 0.001
            IO.pipe
          rescue Errno::EMFILE => e
            errors << e
          end
        end
        sleep 0.001 while fibers.any?(&:alive?)
      end
      pipes.each_with_index { |(_, w), i| w.write(format("pipe%02d", i)) }
    end
    assert_equal 10, errors.size
    assert_equal Array.new(pipes.size) { |i| format("pipe%02d", i) }, received
    assert_no_descriptor_leaked before
  ensure
    pipes&.flatten&.each(&:close)
  end

  # Process.wait watches the child through a pidfd where there is no ring waitid: with no descriptor
  # to make one, it must still reap the child (another way), not fail.
  def test_a_child_is_reaped_while_the_table_is_full
    go_r, go_w = IO.pipe
    before = descriptor_table
    status = nil
    evt do
      pid = fork { exit!(go_r.read(1) == "x" ? 7 : 1) } # still running when the parent waits
      out_of_descriptors do
        go_w.write("x")
        _, status = Process.wait2(pid)
      end
    end
    assert_equal 7, status.exitstatus
    assert_no_descriptor_leaked before
  ensure
    [go_r, go_w].each { |io| io&.close }
  end

  # Runs +code+ in a new Ruby (where no backend has been probed yet) with the descriptor table full,
  # then +after+ once they are freed; returns what each gave (or raised) as a line.
  def in_a_new_process_out_of_descriptors(code, after)
    script = <<~RUBY
      require "evt"
      def outcome
        yield
      rescue Exception => e
        "\#{e.class}: \#{e.message}"
      end
      soft, hard = Process.getrlimit(:NOFILE)
      Process.setrlimit(:NOFILE, Dir.children("/proc/self/fd").size + 4, hard)
      hog = []
      begin
        loop { hog << File.open(File::NULL) }
      rescue Errno::EMFILE
      end
      during = outcome { #{code} }
      hog.each(&:close)
      Process.setrlimit(:NOFILE, soft, hard)
      puts during, outcome { #{after} }
    RUBY
    # (-W:no-experimental: Ruby 4.0 warns once that the IO::Buffer it hands io_read is experimental.)
    output = IO.popen([RbConfig.ruby, "-W:no-experimental", "-I", LIB, "-e", script], err: %i[child out], &:read)
    assert_predicate $?, :success?, output
    output.lines.map(&:chomp)
  end

  # A scheduler needs descriptors of its own (ring, epoll set, wakeup). Made while there are none,
  # it raises Errno::EMFILE, as IO.pipe does, whichever backend is asked for: the backend could run,
  # the process is only short of descriptors for now.
  def test_a_scheduler_made_out_of_descriptors_raises_emfile
    made, backend = in_a_new_process_out_of_descriptors("Evt::Scheduler.new.backend", "Evt::Scheduler.new.backend")
    assert_match(/\AErrno::EMFILE: /, made)
    assert_equal Evt::Scheduler.new.tap(&:close).backend.to_s, backend, "once freed, the same backend as here"
  end

  # Running short of descriptors says nothing about whether a backend can run here: once they are
  # back, every backend is available again (the first probe of each meets EMFILE here).
  def test_backends_probed_out_of_descriptors_are_available_once_freed
    _, availables = in_a_new_process_out_of_descriptors('Evt::Scheduler.availables.join(",")',
                                                        'Evt::Scheduler.availables.join(",")')
    assert_equal Evt::Scheduler.availables.map(&:to_s), availables.split(","), "a backend was lost for good after a transient EMFILE"
  end
end
