# frozen_string_literal: true

require "test_helper"
require "open3"
require "rbconfig"
require "zlib"

# blocking_operation_wait (Ruby 3.4): the blocking operations Ruby offloads (zlib, IO::Buffer copies,
# big-integer division) run on the worker pool's threads while the other fibers go on.
class PoolTest < Minitest::Test
  HOOK = RUBY_VERSION >= "3.4" # Ruby 3.3 has no blocking_operation_wait: its operations block

  def worker_threads
    Thread.list.count { |thread| thread.name == "evt worker" && thread.alive? }
  end

  # Ticks of a fiber sleeping a millisecond at a time while +block+ runs in another fiber.
  def ticks_while
    ticks = 0
    done = false
    evt do
      Fiber.schedule do
        until done
          ticks += 1
          sleep 0.001
        end
      end
      Fiber.schedule do
        yield
      ensure
        done = true
      end
    end
    ticks
  end

  def test_zlib_runs_on_a_worker_while_the_other_fibers_go_on
    skip "Ruby #{RUBY_VERSION} has no blocking_operation_wait" unless HOOK
    data = Random.new(1).bytes(1 << 20) * 16
    deflated = nil
    ticks = ticks_while { deflated = Zlib::Deflate.deflate(data) }
    assert_equal data, Zlib::Inflate.inflate(deflated)
    assert_operator ticks, :>, 5, "the loop stood still while zlib ran"
  end

  # Records the operations Ruby hands blocking_operation_wait.
  class OperationRecorder < Evt::Scheduler
    def operations
      @operations ||= []
    end

    def blocking_operation_wait(work)
      operations << work.class
      super
    end
  end

  # Ruby 4.0 hands a Fiber::Scheduler::BlockingOperation, not a Proc: run on a worker through Ruby's
  # C API (Evt::BlockingOperation), and stopped the same way. A zlib stream interrupted by a timeout
  # stops at once (its unblock function), the fiber raises (Zlib::DataError, as zlib has it without
  # a scheduler too), and the worker serves the next one; a fiber interrupted while its operation
  # waits behind it leaves without waiting for the worker.
  def test_ruby_4_blocking_operations_are_run_and_cancelled_through_its_c_api
    skip "Ruby #{RUBY_VERSION} hands blocking_operation_wait a Proc" unless RUBY_VERSION >= "4"
    data = Random.new(2).bytes(1 << 20) * 64 # seconds of deflate at level 9
    small = Random.new(3).bytes(1 << 16)
    scheduler = OperationRecorder.new(pool_size: 1)
    outcomes = {}
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        # Long beside the queued fiber's 0.05 s: a slow start (ASan) must not change their order.
        Timeout.timeout(1) { Zlib::Deflate.deflate(data, Zlib::BEST_COMPRESSION) }
        outcomes[:running] = :finished
      rescue Timeout::Error, Zlib::Error
        outcomes[:running] = :stopped
      end
      Fiber.schedule do # queued behind the first on the one worker
        Timeout.timeout(0.05) { Zlib::Deflate.deflate(data) }
        outcomes[:queued] = :finished
      rescue Timeout::Error, Zlib::Error
        outcomes[:queued] = [:stopped, outcomes[:running]] # before the first was stopped
      end
      Fiber.schedule do
        sleep 1.1
        outcomes[:next] = Zlib::Inflate.inflate(Zlib::Deflate.deflate(small)) == small
      end
    ensure
      Fiber.set_scheduler(nil)
    end
    assert_equal({running: :stopped, queued: [:stopped, nil], next: true}, outcomes)
    refute_includes scheduler.operations, Proc
    refute_empty scheduler.operations
  end

  def test_work_is_called_once_on_a_worker_thread
    calls = []
    evt do
      result = Fiber.scheduler.blocking_operation_wait(proc { calls << Thread.current })
      refute_nil result
    end
    assert_equal 1, calls.size
    refute_equal Thread.current, calls.first
    assert_equal "evt worker", calls.first.name
  end

  def self.garbage(finalizer)
    ObjectSpace.define_finalizer(Object.new, finalizer)
    nil
  end

  # A finalizer of a collection that an allocation set off runs wherever the GC left a fiber, as
  # a trap handler does, and must not switch fibers (Ruby 4.0 sends the File.unlink of a Tempfile's
  # finalizer here): a worker would suspend the fiber in the middle of it, where an interrupt could
  # end it, and Ruby forbids a Mutex there. The work runs on the loop's thread, as without a scheduler.
  def test_work_in_a_finalizer_runs_on_the_loops_thread
    threads = []
    finalizer = proc { |_id| Fiber.scheduler&.blocking_operation_wait(proc { threads << Thread.current }) }
    evt do
      Fiber.schedule do
        5.times { self.class.garbage(finalizer) }
        collections = GC.count + 3
        Object.new while threads.empty? && GC.count < collections # not GC.start: its finalizers run as calls
      end
    end
    refute_empty threads, "no finalizer ran under the scheduler"
    assert_equal [Thread.current], threads.uniq
  end

  def test_pool_size_zero_runs_the_work_on_the_loops_thread
    where = nil
    scheduler = Evt::Scheduler.new(pool_size: 0)
    Fiber.set_scheduler(scheduler)
    Fiber.schedule { scheduler.blocking_operation_wait(proc { where = Thread.current }) }
    Fiber.set_scheduler(nil)
    assert_equal Thread.current, where
    assert_equal 0, scheduler.pool_size
  end

  def test_an_exception_in_the_work_reaches_the_fiber
    error = nil
    evt do
      error = assert_raises(KeyError) { Fiber.scheduler.blocking_operation_wait(proc { raise KeyError, "inside" }) }
    end
    assert_equal "inside", error.message
  end

  # A timeout while the operation runs stops it (Thread#raise on the worker, which makes Ruby call
  # the operation's unblock function) and the fiber unwinds once the worker has let go.
  def test_a_timeout_stops_a_running_operation_and_the_worker_serves_the_next
    finished = false
    after = nil
    time = elapsed do
      evt do
        assert_raises(Timeout::Error) do
          Timeout.timeout(0.05) { Fiber.scheduler.blocking_operation_wait(proc { sleep 5; finished = true }) }
        end
        after = Fiber.scheduler.blocking_operation_wait(proc { :next }) && :served
      end
    end
    refute finished, "the operation ran to its end"
    assert_equal :served, after
    assert_operator time, :<, 4
  end

  # Fiber#kill runs ensure clauses but no rescue, and Ruby kills again at every switch back into the
  # fiber: the fiber must not unwind (its stack freed, then reused) while a worker still runs its
  # operation, whose state lives on that stack. Before, the worker crashed the VM. In a child: a
  # crash fails this test instead of ending the run.
  def test_a_fiber_killed_while_a_worker_runs_its_operation_waits_for_the_worker
    skip "Ruby #{RUBY_VERSION} has no blocking_operation_wait" unless HOOK
    script = <<~'RUBY'
      require "evt"
      require "zlib"
      data = Random.new(1).bytes(2 << 20)
      ended = wrong = 0
      12.times do |round|
        Evt.run do
          victims = Array.new(3) do
            Fiber.schedule do
              wrong += 1 if Zlib::Inflate.inflate(Zlib::Deflate.deflate(data)) != data
            rescue Zlib::Error
              nil # what zlib raises when a kill interrupts its stream, with or without evt
            ensure
              ended += 1
            end
          end
          Fiber.schedule do
            sleep 0.002 * (round % 4)
            victims.each { |fiber| fiber.kill if fiber.alive? }
            8.times { Fiber.schedule { sleep 0.001 } } # new fibers, on stacks the killed ones freed
          end
        end
      end
      puts "ok ended=#{ended} wrong=#{wrong}"
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-e", script)
    assert status.success?, "the child died (#{status.inspect}):\n#{err[-3000..] || err}"
    assert_equal "ok ended=36 wrong=0\n", out, err
  end

  # Interrupted before a worker took it, the operation never runs.
  def test_an_operation_interrupted_in_the_queue_never_runs
    ran = []
    evt do
      scheduler = Evt::Scheduler.new(pool_size: 1) # not set: only its pool is used
      release = Thread::Queue.new
      Fiber.schedule { scheduler.blocking_operation_wait(proc { release.pop; ran << :first }) }
      waiting = Fiber.schedule do
        scheduler.blocking_operation_wait(proc { ran << :second })
      rescue IOError
        ran << :interrupted
      end
      waiting.raise(IOError, "stop")
      release << true
      sleep 0.01 while ran.size < 2
      scheduler.close
    end
    assert_equal %i[interrupted first], ran
  end

  # Runs the block in a fiber of its own on a pool of one thread that holds completions long
  # (every operation counts as short), then closes the pool.
  def with_holding_pool
    pool = Evt::BlockingPool.new(1, batch_delay: 30, hold_under: 30)
    evt { yield pool }
  ensure
    pool.close
  end

  # With more operations queued than workers, a short operation's fiber is woken later, in a batch.
  def test_a_short_operations_fiber_waits_for_the_batch_while_the_pool_is_saturated
    log = Thread::Queue.new
    gate = Thread::Queue.new
    resumed = Thread::Queue.new
    with_holding_pool do |pool|
      Fiber.schedule { pool.run(proc { gate.pop }) } # keeps the worker until the rest is queued
      Fiber.schedule do
        pool.run(proc { nil }) # ends with two more queued: held
        log << :resumed
        resumed << true
      end
      Fiber.schedule { pool.run(proc { log << (resumed.pop(timeout: 1) ? :saw_it_resume : :ran_while_it_was_held) }) }
      Fiber.schedule { pool.run(proc { nil }) }
      gate << true
    end
    assert_equal %i[ran_while_it_was_held resumed], [log.pop, log.pop]
  end

  # ... but within BATCH_DELAY, even while the only worker is stuck in a long operation.
  def test_a_fiber_held_in_a_batch_is_woken_while_every_worker_is_busy
    log = Thread::Queue.new
    gate = Thread::Queue.new
    release = Thread::Queue.new
    scheduler = Evt::Scheduler.new(pool_size: 1) # not set: only its pool is used
    evt do
      Fiber.schedule { scheduler.blocking_operation_wait(proc { gate.pop }) }
      Fiber.schedule do
        scheduler.blocking_operation_wait(proc { nil }) # ends with two more queued: held
        log << :first_resumed
        release << true
      end
      Fiber.schedule { scheduler.blocking_operation_wait(proc { log << (release.pop(timeout: 10) ? :released : :timed_out) }) }
      Fiber.schedule { scheduler.blocking_operation_wait(proc { nil }) }
      gate << true
    end
    scheduler.close
    assert_equal %i[first_resumed released], [log.pop, log.pop]
  end

  # Longer operations are not held: a Timeout around one must not fire in a wait batching added.
  def test_a_long_operations_fiber_is_woken_at_once
    log = Thread::Queue.new
    resumed = Thread::Queue.new
    pool = Evt::BlockingPool.new(1, batch_delay: 30) # holds only what takes under BlockingPool::SHORT
    evt do
      Fiber.schedule do
        pool.run(proc { sleep 0.01 }) # ends with two more queued, but took too long to be held
        log << :resumed
        resumed << true
      end
      Fiber.schedule { pool.run(proc { log << (resumed.pop(timeout: 10) ? :saw_it_resume : :timed_out) }) }
      Fiber.schedule { pool.run(proc { nil }) }
    end
    assert_equal %i[resumed saw_it_resume], [log.pop, log.pop]
  ensure
    pool.close
  end

  # A fiber that stopped waiting (here Fiber#raise) unwinds as soon as its operation stops.
  def test_an_interrupted_operation_is_not_held
    log = Thread::Queue.new
    started = Thread::Queue.new
    unwound = Thread::Queue.new
    with_holding_pool do |pool|
      waiting = Fiber.schedule do
        pool.run(proc { started << true; Thread::Queue.new.pop }) # runs until stopped
      rescue IOError
        log << :unwound
        unwound << true
      end
      Fiber.schedule { pool.run(proc { log << (unwound.pop(timeout: 10) ? :saw_it_unwind : :timed_out) }) }
      Fiber.schedule { pool.run(proc { nil }) }
      started.pop # the worker runs it
      waiting.raise(IOError, "stop")
    end
    assert_equal %i[unwound saw_it_unwind], [log.pop, log.pop]
  end

  def test_the_pool_starts_lazily_and_ends_with_the_scheduler
    before = worker_threads
    evt do
      assert_equal before, worker_threads, "started before any operation"
      Fiber.scheduler.blocking_operation_wait(proc { nil })
      assert_equal before + Fiber.scheduler.pool_size, worker_threads
    end
    assert_equal before, worker_threads
  end

  def test_a_forked_child_starts_a_pool_of_its_own
    report = nil
    evt do
      scheduler = Fiber.scheduler
      scheduler.blocking_operation_wait(proc { nil }) # the parent's pool runs
      r, w = IO.pipe
      pid = fork do
        r.close
        Fiber.set_scheduler(scheduler) unless Fiber.scheduler # Ruby 4.0's child starts without one
        value = Fiber.scheduler.blocking_operation_wait(proc { Thread.current.name }) && :ran
        w.write("#{value} #{worker_threads}")
        w.close
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException
        w.write("#{e.class}: #{e.message}")
        exit!(1)
      end
      w.close
      report = r.read
      Process.wait(pid)
    end
    assert_equal "ran #{Etc.nprocessors}", report
  end

  def test_pool_size_must_be_an_integer_not_below_zero
    [-1, 1.5, "2"].each do |size|
      error = assert_raises(ArgumentError) { Evt::Scheduler.new(pool_size: size) }
      assert_match(/pool_size must be an Integer >= 0/, error.message)
    end
  end

  def test_evt_pool_size_sets_the_default
    saved = ENV.fetch("EVT_POOL_SIZE", nil)
    ENV["EVT_POOL_SIZE"] = "3"
    assert_equal 3, Evt::Scheduler.new.tap(&:close).pool_size
    assert_equal 1, Evt::Scheduler.new(pool_size: 1).tap(&:close).pool_size
    ENV["EVT_POOL_SIZE"] = "many"
    assert_raises(ArgumentError) { Evt::Scheduler.new }
  ensure
    ENV["EVT_POOL_SIZE"] = saved
  end
end
