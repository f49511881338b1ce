# frozen_string_literal: true

require "test_helper"

# Fault: fork while fibers wait. What test/fork_test.rb leaves out: fibers waiting on pipes, sockets,
# accept and a Queue (not only a sleep) when the fork happens, from a scheduled fiber and from the
# blocking root fiber, on the main thread and on another thread with a scheduler of its own. The
# child makes each of those waiters ready in its copy of the world — data on the pipe and the socket,
# a connection, a Queue push (which Ruby turns into an unblock of the parent's fiber) — and none of
# the parent's fibers may run there; in the child evt starts clean (sleep, pipes, UNIX and TCP
# sockets) and leaves no descriptor behind; in the parent every waiter goes on and gets its data.
class FaultForkTest < Minitest::Test
  CHILD_REPORT = "slept,pipe,unix,tcp,thread,descriptors"

  def evt(timeout: 15, &block)
    super
  end

  # The parent's waiters: each logs "pid name" when it ends, so a run in the child shows.
  class Waiters
    attr_reader :results

    def initialize
      @log_r, @log_w = IO.pipe
      @pipe_r, @pipe_w = IO.pipe
      @near, @far = UNIXSocket.pair
      @server = TCPServer.new("127.0.0.1", 0)
      @queue = Thread::Queue.new
      @results = {}
    end

    def start
      wait(:pipe) { @pipe_r.read(2) }
      wait(:socket) { @near.read(2) }
      wait(:accept) do
        connection = @server.accept
        connection.read.tap { connection.close }
      end
      wait(:queue) { @queue.pop }
      wait(:sleep) { sleep(0.05) && :slept }
    end

    # In the child: makes every waiter ready there, then closes the child's copies of the IOs they
    # wait on (IO#close wakes the waiters of an IO: here there are none, they are the parent's).
    def provoke
      @pipe_w.write("C")
      @far.write("c")
      Socket.tcp("127.0.0.1", @server.local_address.ip_port) { |s| s.write("from the child") }
      @queue << :from_the_child
      [@pipe_r, @near, @server].each(&:close)
    end

    # In the parent, once the child is gone: the parent's own halves.
    def feed
      @pipe_w.write("P")
      @far.write("p")
      @queue << :from_the_parent
    end

    # [pid, name] of every waiter that ended, wherever it ended.
    def log
      @log_w.close
      @log_r.read.lines.map { |line| line.split.then { |pid, name| [Integer(pid), name.to_sym] } }
    end

    def close
      [@log_r, @log_w, @pipe_r, @pipe_w, @near, @far, @server].each { |io| io.close unless io.closed? }
    end

    private

    def wait(name)
      Fiber.schedule do
        @results[name] = yield
      rescue StandardError => e
        @results[name] = e
      ensure
        @log_w.write("#{Process.pid} #{name}\n")
      end
    end
  end

  # The child's own use of evt, through Evt.run (from a root fiber it makes a new scheduler; inside
  # a scheduled fiber it runs on the inherited one, which starts over). Returns what worked.
  def child_work
    results = []
    Evt.run do
      started = monotonic
      Fiber.schedule { sleep 0.01 }
      sleep 0.02
      results << (monotonic - started >= 0.02 ? "slept" : "woke early")
      r, w = IO.pipe
      Fiber.schedule { w.write("pipe") }
      results << r.read(4)
      a, b = UNIXSocket.pair
      Fiber.schedule { b.write(b.read(4).reverse) }
      a.write("xinu")
      results << a.read(4)
      server = TCPServer.new("127.0.0.1", 0)
      Fiber.schedule do
        connection = server.accept
        connection.write(connection.read(3))
        connection.close
      end
      Socket.tcp("127.0.0.1", server.local_address.ip_port) do |client|
        client.write("tcp")
        results << client.read(3)
      end
      [r, w, a, b, server].each(&:close)
      # A thread of the child's own, joined through the scheduler (CRuby's own test scheduler once
      # crashed here, in a child forked from a fiber on a non-main thread).
      queue = Thread::Queue.new
      thread = Thread.new { queue << :thread }
      results << queue.pop.to_s
      thread.join
    end
    results
  end

  # Forks, the child reporting through a pipe (and its status); the child leaves with exit!, so no
  # at_exit (minitest's) and no scheduler close runs there.
  def fork_child(waiters)
    report_r, report_w = IO.pipe
    # What the child inherits, counted before the fork: a kqueue is not inherited (BSD; libkqueue
    # closes it in the child before any code of the child runs), and the child opens its own.
    inherited = open_descriptors - 1 # report_r, closed in the child
    pid = fork do
      report_r.close
      descriptors = inherited
      waiters.provoke
      results = child_work
      # Everything the child opened is closed, and the parent's kernel objects it dropped were not
      # replaced by more than it closed.
      results << (open_descriptors <= descriptors ? "descriptors" : "descriptors #{descriptors} -> #{open_descriptors}")
      # As the thread's end would: close the inherited scheduler (which must not run the parent's
      # fibers here either).
      Fiber.set_scheduler(nil)
      report_w.write(results.join(","))
      report_w.close
      exit!(0)
    rescue Exception => e # rubocop:disable Lint/RescueException
      report_w.write("#{e.class}: #{e.message} #{e.backtrace&.first}")
      report_w.close
      exit!(1)
    end
    report_w.close
    [pid, report_r]
  end

  # One fork with the waiters waiting, from a scheduled fiber or from the blocking root fiber that
  # drives the scheduler. Returns [child's report, child's status, parent's results, log].
  def fork_while_waiting(from)
    waiters = Waiters.new
    report = status = nil
    case from
    when :fiber
      evt do
        waiters.start
        pid, report_r = fork_child(waiters)
        report = report_r.read
        report_r.close
        _, status = Process.wait2(pid)
        waiters.feed
      end
    when :root
      Timeout.timeout(15) do
        Fiber.set_scheduler(Evt::Scheduler.new)
        waiters.start
        pid, report_r = fork_child(waiters) # from the root fiber: nothing is scheduled here
        report = report_r.read
        report_r.close
        _, status = Process.wait2(pid)
        waiters.feed
      ensure
        Fiber.set_scheduler(nil) # runs the waiters to their end
      end
    end
    [report, status, waiters.results, waiters.log]
  ensure
    waiters&.close
  end

  def assert_forked_cleanly(outcome)
    report, status, results, log = outcome
    assert_equal CHILD_REPORT, report
    assert_predicate status, :success?
    assert_equal({pipe: "CP", socket: "cp", accept: "from the child", queue: :from_the_parent, sleep: :slept}, results)
    assert_equal [Process.pid], log.map(&:first).uniq, "a parent's fiber ran in the child: #{log.inspect}"
    assert_equal %i[accept pipe queue sleep socket], log.map(&:last).sort, "each waiter ends once"
  end

  def test_fork_from_a_fiber_on_the_main_thread
    before = descriptor_table
    assert_forked_cleanly(fork_while_waiting(:fiber))
    assert_no_descriptor_leaked before
  end

  def test_fork_from_the_root_fiber_on_the_main_thread
    before = descriptor_table
    assert_forked_cleanly(fork_while_waiting(:root))
    assert_no_descriptor_leaked before
  end

  # The other thread has a scheduler of its own; the main thread's loop waits in the kernel for it
  # meanwhile (in the child that thread and its loop are gone).
  def test_fork_from_a_fiber_on_another_thread
    outcome = evt { Thread.new { fork_while_waiting(:fiber) }.value }
    assert_forked_cleanly(outcome)
  end

  def test_fork_from_the_root_fiber_on_another_thread
    outcome = evt { Thread.new { fork_while_waiting(:root) }.value }
    assert_forked_cleanly(outcome)
  end

  # Forks in a row, each child itself forking once from its own loop: nothing accumulates, in the
  # parent or down the line.
  def test_forks_in_a_row_and_a_grandchild
    before = descriptor_table
    statuses = []
    evt do
      5.times do
        pid = fork do
          grandchild = nil
          Evt.run do
            r, w = IO.pipe
            grandchild = fork do
              exit!(Evt.run { Fiber.schedule { w.write("g") }; r.read(1) } == "g" ? 0 : 1)
            end
            w.close
            r.close
          end
          exit!(Process.wait2(grandchild)[1].success? ? 0 : 2)
        end
        statuses << Process.wait2(pid)[1].exitstatus
      end
    end
    assert_equal [0] * 5, statuses
    assert_no_descriptor_leaked before
  end
end
