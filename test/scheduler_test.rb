# frozen_string_literal: true

require "test_helper"
require "open3"

# The public API: choosing a backend, Evt.run, closing and replacing schedulers.
class SchedulerTest < Minitest::Test
  def test_availables_are_symbols_and_include_the_backend_under_test
    available = Evt::Scheduler.availables
    refute_empty available
    assert(available.all?(Symbol))
    assert_includes available, BACKEND if BACKEND
  end

  def test_each_available_backend_can_be_chosen_by_symbol_or_string
    Evt::Scheduler.availables.each do |name|
      [name, name.to_s].each do |given|
        scheduler = Evt::Scheduler.new(backend: given)
        assert_equal name, scheduler.backend
        scheduler.close
      end
    end
  end

  def test_default_is_evt_backend_or_the_fastest
    scheduler = Evt::Scheduler.new
    assert_equal BACKEND || Evt::Scheduler.availables.first, scheduler.backend
    scheduler.close
  end

  def test_evt_backend_overrides_the_automatic_choice_but_not_an_explicit_one
    with_env("EVT_BACKEND", Evt::Scheduler.availables.last.to_s) do
      assert_equal Evt::Scheduler.availables.last, Evt::Scheduler.new.tap(&:close).backend
      first = Evt::Scheduler.availables.first
      assert_equal first, Evt::Scheduler.new(backend: first).tap(&:close).backend
    end
  end

  def test_unknown_backend_raises_argument_error_naming_the_available_ones
    error = assert_raises(ArgumentError) { Evt::Scheduler.new(backend: :nope) }
    assert_match(/backend :nope is unknown/, error.message)
    Evt::Scheduler.availables.each { |name| assert_includes error.message, name.inspect }
  end

  def test_unknown_evt_backend_raises_argument_error
    with_env("EVT_BACKEND", "nope") do
      error = assert_raises(ArgumentError) { Evt::Scheduler.new }
      assert_match(/EVT_BACKEND :nope is unknown/, error.message)
    end
  end

  def test_backend_of_the_wrong_type_raises_type_error
    error = assert_raises(TypeError) { Evt::Scheduler.new(backend: 42) }
    assert_match(/Symbol or String/, error.message)
  end

  def test_run_returns_the_block_value
    assert_equal 42, evt { 42 }
  end

  def test_run_needs_a_block
    assert_raises(ArgumentError) { Evt.run }
  end

  def test_run_raises_the_block_exception_once_the_other_fibers_are_done
    finished = false
    error = assert_raises(KeyError) do
      evt do
        Fiber.schedule do
          sleep 0.01
          finished = true
        end
        raise KeyError, "from the block"
      end
    end
    assert_equal "from the block", error.message
    assert finished
  end

  def test_run_sets_a_scheduler_for_the_block_and_restores_none_after
    inside = nil
    evt { inside = Fiber.scheduler }
    assert_kind_of Evt::Scheduler, inside
    assert_nil Fiber.scheduler
  end

  def test_run_inside_a_scheduled_fiber_runs_the_block_on_the_same_scheduler
    outer = inner = nil
    value = evt do
      outer = Fiber.scheduler
      Evt.run do
        inner = Fiber.scheduler
        :inner
      end
    end
    assert_equal :inner, value
    assert_same outer, inner
  end

  def test_a_closed_scheduler_and_a_new_one_on_the_same_thread
    done = []
    first = Evt::Scheduler.new
    Fiber.set_scheduler(first)
    Fiber.schedule do
      sleep 0.01
      done << :first
    end
    Fiber.set_scheduler(nil) # closing runs the first to completion
    assert_equal [:first], done
    assert first.closed?

    second = Evt::Scheduler.new
    Fiber.set_scheduler(second)
    Fiber.schedule do
      sleep 0.01
      done << :second
    end
    second.close
    assert_nil Fiber.scheduler
    assert_equal %i[first second], done
  end

  def test_close_releases_the_kernel_objects
    before = descriptor_table
    10.times { Evt::Scheduler.new.close }
    assert_no_descriptor_leaked before
  end

  def test_a_scheduler_dropped_without_close_releases_its_descriptors_when_collected
    before = open_descriptors
    make_schedulers(20)
    GC.start
    GC.start
    # A conservative stack scan may keep one alive; twenty would mean none was released.
    assert_operator open_descriptors, :<=, before + 4
  end

  def test_a_thread_ending_with_an_exception_keeps_it_while_the_scheduler_closes
    thread = Thread.new do
      Thread.current.report_on_exception = false
      Fiber.set_scheduler(Evt::Scheduler.new)
      Fiber.schedule do
        sleep 0.01
        begin
          raise "handled inside a fiber"
        rescue RuntimeError
          nil
        end
      end
      raise "boom"
    end
    error = assert_raises(RuntimeError) { thread.join }
    assert_equal "boom", error.message
  end

  def test_run_from_inside_a_scheduled_fiber_raises_fiber_error
    error = nil
    evt { error = assert_raises(FiberError) { Fiber.scheduler.run } }
    assert_match(/blocking fiber/, error.message)
  end

  def test_wakeup_from_another_thread_ends_a_wait_early
    woke = nil
    evt do
      scheduler = Fiber.scheduler
      Thread.new do
        sleep 0.05
        scheduler.wakeup
      end
      # A fiber blocked with no timeout leaves the loop waiting in the kernel; wakeup must not lose
      # it or break the wait: the unblock that follows must still arrive.
      fiber = Fiber.schedule { woke = Fiber.scheduler.block(:test, nil) }
      Thread.new do
        sleep 0.1
        scheduler.unblock(:test, fiber)
      end
    end
    assert_equal true, woke
  end

  def test_a_scheduler_made_in_one_thread_serves_another
    scheduler = Evt::Scheduler.new
    done = false
    Thread.new do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        sleep 0.01
        done = true
      end
    end.join
    assert done
  end

  def test_closing_from_another_thread_while_fibers_wait_raises_thread_error
    scheduler = nil
    ready = Thread::Queue.new
    woke = false
    owner = Thread.new do
      scheduler = Evt::Scheduler.new
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        ready << true
        sleep 0.1
        woke = true
      end
      scheduler.run
    end
    ready.pop
    assert_raises(ThreadError) { scheduler.close }
    owner.join
    assert woke, "the owner's fiber must be unaffected"
  end

  def test_an_exception_raised_into_the_loop_as_its_wait_ends_loses_no_event
    retried = false
    got = nil
    scheduler = Evt::Scheduler.new
    Fiber.set_scheduler(scheduler)
    r, w = IO.pipe
    Fiber.schedule { got = r.read(1) }
    main = Thread.current
    Thread.new do
      sleep 0.1 # the loop waits in the kernel by now
      w.write_nonblock("x") # the event arrives while this thread holds the GVL...
      main.raise(IndexError) # ...and so does the exception
    end
    begin
      Timeout.timeout(5) { scheduler.run }
    rescue IndexError
      retried = true
      retry
    end
    Fiber.set_scheduler(nil)
    assert retried
    assert_equal "x", got
  end

  def test_a_scheduler_abandoned_with_fibers_ready_can_be_collected
    20.times do
      thread = Thread.new do
        Thread.current.report_on_exception = false
        Fiber.set_scheduler(Evt::Scheduler.new)
        Fiber.schedule do
          sleep 0.001
          raise SystemExit
        end
        10.times { Fiber.schedule { sleep 0.001 } }
      end
      assert_raises(SystemExit) { thread.join }
    end
    GC.start(full_mark: true, immediate_sweep: true)
    GC.start
    pass # survived collecting the loops and their fibers, in whatever order
  end

  # A subclass with an initialize of its own, as a library might write.
  def test_a_subclass_takes_its_own_arguments
    subclass = Class.new(Evt::Scheduler) do
      attr_reader :name

      def initialize(name, **options)
        @name = name
        super(**options)
      end
    end
    scheduler = subclass.new("mine", backend: Evt::Scheduler.availables.first)
    assert_equal "mine", scheduler.name
    assert_kind_of Evt::Scheduler, scheduler
    scheduler.close
  end

  # Thread#kill ends a thread whose fibers wait on IO that never comes: they end through their
  # ensure clauses (running them to completion, as a normal thread end does, would wait forever),
  # and their reads leave the kernel: data written afterwards stays in the pipes.
  def test_thread_kill_ends_the_waiting_fibers_and_their_reads
    pipes = Array.new(8) { IO.pipe }
    ensured = 0
    started = Thread::Queue.new
    thread = Thread.new do
      scheduler = Evt::Scheduler.new
      Fiber.set_scheduler(scheduler)
      pipes.each do |r, _|
        Fiber.schedule do
          r.gets
        ensure
          ensured += 1
        end
      end
      started << true
      scheduler.run
    end
    started.pop
    thread.kill
    assert thread.join(10), "the killed thread did not end"
    assert_equal pipes.size, ensured
    pipes.each { |_, w| w.write("late\n") }
    assert_equal ["late\n"] * pipes.size, pipes.map { |r, _| r.read_nonblock(16) }
  ensure
    pipes&.flatten&.each(&:close)
  end

  # A subclass runs on every backend, chosen by name or by EVT_BACKEND (Ruby's own test/fiber
  # subclasses the scheduler under test): its overrides come first and reach evt's hooks with super.
  def test_a_subclass_runs_on_every_backend_however_chosen
    calls = 0
    subclass = Class.new(Evt::Scheduler) do
      define_method(:io_wait) do |io, events, timeout|
        calls += 1
        super(io, events, timeout)
      end
    end
    Evt::Scheduler.availables.each do |name|
      [{backend: name}, {}].each do |options|
        scheduler = options.empty? ? with_env("EVT_BACKEND", name.to_s) { subclass.new } : subclass.new(**options)
        assert_equal name, scheduler.backend
        assert_kind_of subclass, scheduler
        r, w = IO.pipe
        got = Thread.new do
          Fiber.set_scheduler(scheduler)
          Fiber.schedule { r.wait_readable }
          Fiber.schedule { w.write("x") }
          :done
        end.value
        assert_equal :done, got
        r.close
        w.close
      end
    end
    assert_operator calls, :>=, 2 * Evt::Scheduler.availables.size
  end

  # Code that closes every IO it finds (before exec, say) may close the select loop's wakeup pipe.
  def test_closing_every_io_object_leaves_the_loop_working
    script = <<~RUBY
      require "evt"
      Evt.run do
        r, w = IO.pipe
        keep = [STDIN, STDOUT, STDERR, r, w]
        ObjectSpace.each_object(IO) { |io| io.close unless keep.include?(io) || io.closed? rescue nil }
        Fiber.schedule { sleep 0.05; w.write("x") }
        print r.read(1)
      end
    RUBY
    out, status = Open3.capture2(RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", "-e", script)
    assert status.success?
    assert_equal "x", out
  end

  private

  def make_schedulers(count)
    count.times { Evt::Scheduler.new }
    nil
  end

  def with_env(name, value)
    saved = ENV.fetch(name, nil)
    ENV[name] = value
    yield
  ensure
    ENV[name] = saved
  end
end
