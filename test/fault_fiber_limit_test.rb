# frozen_string_literal: true

require "test_helper"
require "rbconfig"
require "open3"

# Fault: no memory for one more fiber stack — what vm.max_map_count does at about 31,700 fibers
# (each stack is mmap'd, with a guard page). Ruby then raises FiberError where the fiber first runs:
# without a scheduler at its first resume, with evt in Fiber.schedule, which starts it at once. That
# error must reach the caller, and the loop go on: the fibers already made finish, and once some
# have ended their stacks serve new ones. The machine's vm.max_map_count is not ours to lower, so a
# child Ruby gets the same failure early: huge fiber stacks (RUBY_FIBER_MACHINE_STACK_SIZE) under a
# small address-space limit (RLIMIT_AS), a few dozen fibers in all.
class FaultFiberLimitTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)
  STACK = 64 << 20 # bytes of machine stack per fiber

  # Shared by the child's scripts: the address-space limit, with a reserve mapped beforehand and
  # freed once fibers have run out, so that the rest of the script has room to run.
  PRELUDE = <<~'RUBY'
    require "evt"
    Warning[:experimental] = false
    # write_nonblock: reports never go through a scheduler, whatever state the thread is left in.
    def report(key, value) = $stdout.write_nonblock("#{key}=#{value.inspect}\n")
    used = File.read("/proc/self/status")[/VmSize:\s+(\d+)/, 1].to_i * 1024
    $reserve = IO::Buffer.new(256 << 20) # mapped: it holds address space until freed
    Process.setrlimit(:AS, used + (256 << 20) + 24 * Integer(ENV["RUBY_FIBER_MACHINE_STACK_SIZE"]))
    def free_reserve = ($reserve&.free; $reserve = nil)
  RUBY

  # Runs +script+ (after PRELUDE) in a child Ruby; returns what it reported, as a Hash of strings.
  # A child that hangs is killed, and the test fails with what it said so far.
  def run_child(script)
    env = {"RUBY_FIBER_MACHINE_STACK_SIZE" => STACK.to_s}
    reader, writer = IO.pipe
    pid = Process.spawn(env, RbConfig.ruby, "-I", LIB, "-e", PRELUDE + script, out: writer, err: writer)
    writer.close
    output = +""
    begin
      Timeout.timeout(20) { output << reader.read }
    rescue Timeout::Error
      Process.kill(:KILL, pid)
      output << reader.read_nonblock(1 << 20, exception: false).to_s
      flunk "the child hung; it said:\n#{output}"
    ensure
      Process.wait(pid)
      reader.close
    end
    assert_predicate $?, :success?, output
    output.lines.grep(/\A\w+=/).to_h { |line| line.chomp.split("=", 2) }
  end

  # Without a scheduler: how many fibers fit, and what Ruby raises for the next one.
  def test_without_a_scheduler_the_first_resume_raises_fiber_error
    reported = run_child(<<~'RUBY')
      fibers = []
      begin
        loop { fibers << Fiber.new { Fiber.yield }.tap(&:resume) }
      rescue Exception => e
        free_reserve
        report :error, e.class
        report :made, fibers.size
      end
      fibers.each(&:resume)
      report :again, Fiber.new { :ran }.resume
    RUBY
    assert_equal "FiberError", reported["error"]
    assert_operator reported["made"].to_i, :>=, 2
    assert_equal ":ran", reported["again"]
  end

  # The scheduling half of the child, run from a scheduled fiber or from the root fiber: schedules
  # fibers that wait on a Queue until Fiber.schedule raises, then checks that the loop goes on and
  # that the stacks of fibers that ended serve new ones. Every failure is reported, never left to
  # hang the loop (the fibers on the queue are always let go).
  SCHEDULE_UNTIL_FULL = <<~'RUBY'
    def schedule_until_full
      queue = Thread::Queue.new
      done = []
      waiting = []
      half = 0
      ticks = 0
      ticking = true
      ticker = Fiber.schedule do
        while ticking
          sleep 0.001
          ticks += 1
        end
      end
      schedule = lambda do |count|
        count.times { waiting << Fiber.schedule { done << queue.pop } }
        nil
      rescue Exception => e
        e
      end
      error = schedule.call(1_000_000)
      free_reserve
      report :error, error.class
      report :message, error&.message
      made = waiting.size
      report :made, made
      # The loop goes on: the timer fiber ticks.
      seen = ticks
      sleep 0.001 until ticks >= seen + 3
      report :ticked, true
      # Half the fibers end, and are dropped, as a server drops its finished connections' fibers.
      half = made / 2
      half.times { |i| queue << i }
      sleep 0.001 until done.size == half
      waiting.select!(&:alive?)
      report :ended, done.size
      # As many new ones fit in their stacks.
      error = schedule.call(half)
      report :remade, waiting.size - (made - half)
      report :remake_error, error&.message
    ensure
      waiting.size.times { |i| queue << half + i } # every waiter gets its own item: 0, 1, 2...
      sleep 0.001 until waiting.none?(&:alive?)
      report :all_done, done.sort == Array.new(half + waiting.size) { |i| i }
      ticking = false
    end
  RUBY

  def assert_schedule_until_full(reported)
    assert_equal "FiberError", reported["error"], "Fiber.schedule must raise FiberError to its caller"
    assert_match(/stack|memory|guard/, reported["message"])
    made = reported["made"].to_i
    assert_operator made, :>=, 2
    assert_equal "true", reported["ticked"], "the loop stopped while fibers could not be made"
    assert_equal (made / 2).to_s, reported["ended"]
    # All of them but perhaps one or two that a conservative stack scan keeps alive, were the stacks
    # only given back by the garbage collector.
    assert_operator reported["remade"].to_i, :>=, made / 2 - 2,
                    "the stacks of the #{made / 2} fibers that ended did not serve new ones: #{reported["remake_error"]}"
    assert_equal "true", reported["all_done"], "a fiber never got its item"
  end

  def test_fiber_schedule_from_a_scheduled_fiber_raises_fiber_error_and_the_loop_goes_on
    reported = run_child(SCHEDULE_UNTIL_FULL + <<~'RUBY')
      Evt.run { schedule_until_full }
      report :finished, true
    RUBY
    assert_schedule_until_full(reported)
    assert_equal "true", reported["finished"]
  end

  # The long form: Fiber.schedule called on the root fiber (the blocking one that drives the loop),
  # before the loop runs. The root fiber must stay blocking after the FiberError: else its own I/O
  # goes through the scheduler (CRuby 3.3/3.4 lower the thread's blocking count before allocating
  # the stack, and a FiberError skips raising it again).
  def test_fiber_schedule_from_the_root_fiber_raises_fiber_error_and_the_loop_goes_on
    reported = run_child(SCHEDULE_UNTIL_FULL + <<~'RUBY')
      Fiber.set_scheduler(Evt::Scheduler.new)
      queue = Thread::Queue.new
      waiting = []
      begin
        loop { waiting << Fiber.schedule { queue.pop } }
      rescue Exception => e
        free_reserve
        report :root_error, e.class
      end
      report :root_blocking, Fiber.blocking?
      exit!(0) unless Fiber.blocking? # the rest would wait in the loop from the loop's own fiber
      # The fibers made so far end and are dropped (CRuby gives a transferred fiber's stack back only
      # once the Fiber is collected); then a driver schedules more from inside the loop.
      waiting.size.times { queue << :go }
      Fiber.scheduler.run
      report :root_fibers_done, waiting.none?(&:alive?)
      waiting.clear
      Fiber.schedule { schedule_until_full }
      Fiber.set_scheduler(nil) # runs the loop until every fiber is done
      report :finished, waiting.none?(&:alive?)
    RUBY
    assert_equal "FiberError", reported["root_error"]
    assert_equal "1", reported["root_blocking"], "after the FiberError the root fiber no longer counts as blocking"
    assert_equal "true", reported["root_fibers_done"]
    assert_schedule_until_full(reported)
    assert_equal "true", reported["finished"]
  end
end
