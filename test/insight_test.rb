# frozen_string_literal: true

require "test_helper"
require "tempfile"

# What a scheduler shows of itself: every fiber with what it waits for (#fibers, Evt.dump), and
# the loop's counters (#stats).
class InsightTest < Minitest::Test
  # A scheduler of the backend under test as the thread's: the block schedules fibers, which then
  # run to their end; its value is the block's. Fibers left by a failure are killed.
  def with_scheduler(**options)
    scheduler = Evt::Scheduler.new(**options)
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      value = yield scheduler
      scheduler.run
      value
    ensure
      scheduler.kill_all
      Fiber.set_scheduler(nil)
    end
  end

  # Fibers stuck each on one thing; returns the test's line each one waits on, by name.
  def stick_fibers(scheduler, reader, queue, mutex, gate)
    lines = {}
    Fiber.schedule { lines[:io] = __LINE__; reader.read(1) }
    Fiber.schedule { lines[:queue] = __LINE__; queue.pop }
    Fiber.schedule { mutex.lock; sleep 60 } # holds the mutex
    Fiber.schedule { lines[:mutex] = __LINE__; mutex.synchronize { nil } }
    Fiber.schedule { lines[:sleep] = __LINE__; sleep 60 }
    Fiber.schedule { lines[:select] = __LINE__; IO.select([reader], nil, nil, 60) }
    Fiber.schedule { lines[:timeout] = __LINE__; Timeout.timeout(30) { sleep 50 } }
    Fiber.schedule { lines[:blocking] = __LINE__; scheduler.blocking_operation_wait(proc { gate.pop }) }
    pid = Process.spawn(RbConfig.ruby, "-e", "sleep 60")
    Fiber.schedule { lines[:process] = __LINE__; Process.wait(pid) }
    [lines, pid]
  end

  def check_fibers(states, lines, reader, queue, pid)
    by_line = lines.to_h do |name, line|
      [name, states.find { |state| state.backtrace&.any? { |frame| frame.start_with?("#{__FILE__}:#{line}:") } }]
    end
    missing = by_line.select { |_, state| state.nil? }.keys
    assert_empty missing, "no fiber's backtrace points at these waits' lines:\n#{states.join("\n")}"
    assert_equal [:io, reader.fileno, [:read]], [by_line[:io].wait, by_line[:io].fd, by_line[:io].events]
    assert_equal [:block, queue], [by_line[:queue].wait, by_line[:queue].subject]
    assert_equal :block, by_line[:mutex].wait
    assert_kind_of Thread::Mutex, by_line[:mutex].subject
    assert_equal :sleep, by_line[:sleep].wait
    assert_in_delta 60, by_line[:sleep].deadline, 5
    assert_equal [:select, [reader]], [by_line[:select].wait, by_line[:select].subject]
    assert_equal :sleep, by_line[:timeout].wait
    assert_in_delta 30, by_line[:timeout].timeout, 5
    assert_equal :blocking, by_line[:blocking].wait
    assert_equal [:process, pid], [by_line[:process].wait, by_line[:process].subject]
    by_line.each_value do |state|
      assert_equal :suspended, state.state
      assert_operator state.waited, :>=, 0
      assert_match(/\Afiber \d+ \[#{state.wait}/, state.to_s)
    end
    assert_equal [:running], states.select { |state| state.fiber == Fiber.current }.map(&:state)
  end

  def test_fibers_lists_each_fiber_with_its_kind_of_wait_a_duration_and_a_backtrace_to_its_line
    reader, writer = IO.pipe
    queue = Thread::Queue.new
    gate = Thread::Queue.new
    pid = nil
    with_scheduler(pool_size: 1) do |scheduler|
      lines, pid = stick_fibers(scheduler, reader, queue, Thread::Mutex.new, gate)
      Fiber.schedule do
        sleep 0.01 until scheduler.stats[:pool][:running] == 1 # the worker has the operation
        states = scheduler.fibers
        check_fibers(states, lines, reader, queue, pid)
        expected = states.reject { |state| state.state == :running }.map(&:wait).tally
        assert_equal expected.sort.to_h, scheduler.stats[:waits].sort.to_h, "stats[:waits] counts what #fibers lists"
        assert_equal 1, expected[:blocking]
      ensure
        writer.write("x")
        queue << 1
        gate << 1
        scheduler.kill_all # the sleepers, the mutex's holder and waiter, the process's waiter
      end
    end
  ensure
    if pid
      Process.kill(:KILL, pid)
      Process.wait(pid) rescue nil # rubocop:disable Style/RescueModifier
    end
    [reader, writer].each { |io| io&.close }
  end

  # The stuck reader's line, for the dumps to point at.
  STUCK_LINE = __LINE__ + 3

  def schedule_stuck_reader(reader)
    Fiber.schedule { reader.read(1) rescue IOError } # rubocop:disable Style/RescueModifier
  end

  def test_evt_dump_prints_each_scheduler_and_its_fibers_with_their_backtraces
    reader, writer = IO.pipe
    output = Tempfile.create("dump")
    with_scheduler do
      schedule_stuck_reader(reader)
      Fiber.schedule do
        Evt.dump(output)
        writer.write("x")
      end
    end
    output.rewind
    text = output.read
    assert_match(/\Aevt: dump of pid #{Process.pid} at /, text)
    assert_match(/^scheduler \d+ \(\w+\): 2 fibers, /, text)
    assert_match(/^fiber \d+ \[io fd=#{reader.fileno} read, [\d.]+ s\]:\n/, text)
    assert_match(/^fiber \d+ \[running\]:\n/, text)
    assert_includes text, "\t#{__FILE__}:#{STUCK_LINE}:"
  ensure
    output&.close
    [reader, writer].each { |io| io&.close }
  end

  def test_a_dump_on_a_signal_prints_the_fibers_while_a_client_keeps_getting_answers
    skip "no SIGUSR2 here" unless Signal.list.key?("USR2")
    server = TCPServer.new("127.0.0.1", 0)
    reader, writer = IO.pipe
    output = Tempfile.create("dump")
    previous = Evt.dump_on("USR2", output)
    answers = asked = 0
    with_scheduler do
      Fiber.schedule do
        client = server.accept
        client.write(client.gets) until client.eof?
        client.close
      end
      schedule_stuck_reader(reader)
      Fiber.schedule do
        client = TCPSocket.new("127.0.0.1", server.addr[1])
        deadline = monotonic + 10
        until (asked >= 20 && output.size.positive?) || monotonic > deadline
          Process.kill(:USR2, Process.pid) if asked == 10
          client.write("#{asked}\n")
          answers += 1 if client.gets == "#{asked}\n"
          asked += 1
        end
        client.close
        writer.write("x")
      end
    end
    assert_equal asked, answers
    output.rewind
    text = output.read
    assert_match(/^fiber \d+ \[io fd=#{reader.fileno} read, /, text)
    assert_includes text, "\t#{__FILE__}:#{STUCK_LINE}:"
  ensure
    Signal.trap("USR2", previous || "DEFAULT") if Signal.list.key?("USR2")
    output&.close
    [server, reader, writer].each { |io| io&.close }
  end

  def test_evt_dump_signal_sets_up_the_dump_from_the_environment
    skip "no SIGUSR2 here" unless Signal.list.key?("USR2")
    script = <<~RUBY
      require "evt"
      Evt.run do
        Fiber.schedule { sleep 0.5 }
        Process.kill(:USR2, Process.pid)
        sleep 0.2
      end
    RUBY
    saved = ENV.fetch("EVT_DUMP_SIGNAL", nil)
    ENV["EVT_DUMP_SIGNAL"] = "USR2"
    output, status = run_ruby(script, limit: 30)
    assert status&.success?, output
    assert_match(/^evt: dump of pid \d+ at /, output)
    assert_match(/^fiber \d+ \[sleep, .*deadline in /, output)
  ensure
    ENV["EVT_DUMP_SIGNAL"] = saved
  end

  def test_stats_count_a_thousand_sleeps_as_timers_fired
    with_scheduler do |scheduler|
      before = scheduler.stats
      Fiber.schedule { 1000.times { sleep 0.0001 } }
      Fiber.schedule { 10.times { sleep 0.001 } }
      Fiber.scheduler.run
      after = scheduler.stats
      assert_equal 1010, after[:timers_fired] - before[:timers_fired]
      assert_operator after[:timers_armed] - before[:timers_armed], :>=, 1010
      assert_equal 2, after[:fibers_finished] - before[:fibers_finished]
      assert_equal after[:fibers_started], after[:fibers_finished] + after[:fibers_alive]
      assert_operator after[:turns], :>=, 1000
      assert_operator after[:timer_late_p50], :>, 0
      assert_operator after[:timer_late_p99], :>=, after[:timer_late_p50]
    end
  end

  def test_stats_count_the_events_of_ten_thousand_echoes
    left, right = UNIXSocket.pair
    with_scheduler do |scheduler|
      before = scheduler.stats
      Fiber.schedule do
        10_000.times { right.write(right.readpartial(16)) }
      end
      Fiber.schedule do
        10_000.times do |i|
          left.write("x")
          raise "echo #{i} lost" unless left.readpartial(16) == "x"
        end
      end
      Fiber.scheduler.run
      after = scheduler.stats
      # Each echo waits at least once for the other side: an event, or a completion of the ring's.
      assert_operator after[:events] - before[:events], :>=, 10_000
      assert_operator after[:kernel_waits] - before[:kernel_waits], :>, 0
      assert_operator after[:events_per_turn], :>, 0
    end
  ensure
    left&.close
    right&.close
  end

  def test_utilization_is_near_one_when_busy_and_near_zero_when_idle
    idle = with_scheduler do |scheduler|
      Fiber.schedule { sleep 0.3 }
      Fiber.scheduler.run
      scheduler.stats[:utilization]
    end
    busy = with_scheduler do |scheduler|
      Fiber.schedule do
        finish = monotonic + 0.3
        sleep 0 while monotonic < finish
      end
      Fiber.scheduler.run
      scheduler.stats[:utilization]
    end
    assert_operator idle, :<, 0.5
    assert_operator busy, :>, 0.8
  end

  # Read from another thread while the loop waits in the kernel (as Evt.dump does), the wait under
  # way counts as idle time.
  def test_a_wait_in_the_kernel_under_way_counts_as_idle
    reader, writer = IO.pipe
    scheduler = nil
    loop_thread = Thread.new do
      scheduler = Evt::Scheduler.new
      Fiber.set_scheduler(scheduler)
      Fiber.schedule { reader.read(1) }
    end
    deadline = monotonic + 10
    sleep 0.01 until scheduler&.stats&.dig(:fibers_suspended) == 1 || monotonic > deadline
    assert_equal 1, scheduler.stats[:fibers_suspended], "the fiber never waited"
    sleep 0.3
    stats = scheduler.stats
    assert_operator stats[:utilization], :<, 0.5, stats.inspect
    assert_operator stats[:kernel_seconds], :>, 0.2, stats.inspect
    writer.write("x")
    loop_thread.join
  ensure
    [reader, writer].each { |io| io&.close }
  end

  def test_backend_fallbacks_name_each_faster_backend_that_cannot_run_here
    scheduler = Evt::Scheduler.new
    fallbacks = scheduler.backend_fallbacks
    scheduler.close
    faster = Evt.extension? ? Evt::Loop.backends.take_while { |name| name != scheduler.backend } : []
    assert_equal faster - Evt::Scheduler.availables, fallbacks.keys - [:extension]
    fallbacks.each_value { |reason| assert_match(/\A\S.{8,}/, reason) }
    if Evt::EXTENSION_MISSING
      assert_equal Evt::EXTENSION_MISSING, fallbacks[:extension]
    else
      refute fallbacks.key?(:extension)
    end
  end

  def test_evt_debug_prints_the_backend_once
    script = 'require "evt"; 2.times { Evt.run { } }; puts Evt::Scheduler.new.backend'
    saved = ENV.fetch("EVT_DEBUG", nil)
    ENV["EVT_DEBUG"] = "1"
    output, status = run_ruby(script, limit: 30)
    assert status&.success?, output
    lines = output.lines.grep(/\Aevt: the /)
    assert_equal 1, lines.size, output
    assert_match(/\Aevt: the #{output.lines.last.chomp} backend/, lines.first)
  ensure
    ENV["EVT_DEBUG"] = saved
  end

  def test_stats_keys_are_the_documented_ones
    keys = with_scheduler { |scheduler| scheduler.stats.keys }
    documented = %i[backend turns kernel_waits events events_per_turn busy_seconds kernel_seconds utilization
                    fibers_started fibers_finished fibers_alive fibers_ready fibers_ready_max fibers_suspended waits
                    timers_armed timers_pending timers_fired timer_late_p50 timer_late_p99 requests pool]
    documented += %i[submissions completions overflows] if keys.include?(:submissions)
    assert_equal documented.sort, keys.sort
  end
end
