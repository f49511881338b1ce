# frozen_string_literal: true

require_relative "test_helper"

# evt's loop inside a Ractor other than the main one: every behaviour the main Ractor has, on the
# backend under test, and several Ractors each running its own loop at once. The work is in
# RactorWork's methods (a Ractor's block may not see the test's variables); each returns what the
# test asserts on, back in the main Ractor.
module RactorWork
  module_function

  # The work of +name+ in a new Ractor with its own loop; its answer, or its exception raised here.
  def in_ractor(name, *args)
    answer(Ractor.new(name, args) { |work, arguments| RactorWork.public_send(work, *arguments) })
  rescue Ractor::RemoteError => e
    raise e.cause, cause: nil
  end

  # What +ractor+'s block returned (Ruby 4.0 has Ractor#value, 3.3 and 3.4 #take).
  def answer(ractor)
    ractor.respond_to?(:value) ? ractor.value : ractor.take
  end

  def run(&block)
    Evt.run(&block)
  end

  def sleeps
    woke = []
    run do
      [0.03, 0.01, 0.02].each { |delay| Fiber.schedule { sleep delay; woke << delay } }
    end
    [Fiber.scheduler, woke]
  end

  def tcp_echo(messages = 20)
    answers = []
    run do
      server = TCPServer.new("127.0.0.1", 0)
      Fiber.schedule do
        client = server.accept
        while (line = client.gets)
          client.write(line.upcase)
        end
        client.close
      end
      Fiber.schedule do
        socket = TCPSocket.new("127.0.0.1", server.local_address.ip_port)
        messages.times { |i| socket.write("hello #{i}\n"); answers << socket.gets }
        socket.close
        server.close
      end
    end
    answers
  end

  def pipe
    read = nil
    run do
      reader, writer = IO.pipe
      Fiber.schedule { read = reader.read }
      Fiber.schedule do
        3.times { |i| writer.write("part #{i};"); sleep 0.001 }
        writer.close
      end
    end
    read
  end

  def timeout
    outcome = nil
    run do
      Fiber.schedule do
        Timeout.timeout(0.02) { sleep 5 }
        outcome = :not_raised
      rescue Timeout::Error => e
        outcome = e.class.name
      end
    end
    outcome
  end

  def queue
    taken = []
    run do
      queue = Thread::Queue.new
      Fiber.schedule { 3.times { taken << queue.pop } }
      Fiber.schedule { 3.times { |i| queue << i; sleep 0.001 } }
    end
    taken
  end

  def close_wakes_waiters
    errors = []
    run do
      reader, writer = IO.pipe
      2.times { Fiber.schedule { reader.read(1) rescue errors << [$!.class.name, $!.message] } }
      Fiber.schedule do
        reader.close
        writer.close
      end
    end
    errors
  end

  def process_wait
    status = nil
    ticks = 0
    run do
      Fiber.schedule do
        pid = Process.spawn("sh", "-c", "sleep 0.05; exit 3")
        _, status = Process.wait2(pid)
      end
      Fiber.schedule { while status.nil? && ticks < 10_000; ticks += 1; sleep 0.001; end }
    end
    [status.exitstatus, ticks.positive?]
  end

  def resolve
    addresses = nil
    run do
      Fiber.schedule { addresses = Addrinfo.getaddrinfo("localhost", 80, nil, :STREAM).map(&:ip_address).uniq }
    end
    addresses
  end

  def mutex_and_condition
    order = []
    run do
      mutex = Thread::Mutex.new
      condition = Thread::ConditionVariable.new
      Fiber.schedule { mutex.synchronize { condition.wait(mutex, 5); order << :woken } }
      Fiber.schedule { mutex.synchronize { order << :signal; condition.signal } }
    end
    order
  end

  def file(path)
    read = nil
    run do
      Fiber.schedule do
        File.write(path, "written in a Ractor")
        read = File.read(path)
      end
    end
    read
  end

  # Loops made, used without fibers and dropped, while IOs close: what every Ractor does to the
  # process's list of loops (safe on Ruby 3.3 and 3.4 in several Ractors at once: no fiber).
  # Loops made and dropped (some left to the GC) with IOs closed meanwhile: [loops made, loops
  # refused] (refused: Ruby 3.3 and 3.4, while another Ractor has a loop open).
  def loops_and_closes(rounds)
    refused = 0
    rounds.times do |i|
      scheduler = Evt::Scheduler.new
      reader, writer = IO.pipe
      writer.close
      reader.close
      scheduler.close unless (i % 4).zero? # every fourth is left to the GC
      GC.start if (i % 50).zero? # ... which frees those loops, on whichever thread
    rescue Evt::RactorError
      refused += 1
    end
    [rounds - refused, refused]
  end

  # Stall reports, the fiber list and the counters of a loop in this Ractor: the reports' states and
  # whether one named the spinning method, the waits the list shows, the timers the stats counted.
  def insight
    reports = [] # appended to by the watch's thread
    scheduler = Evt::Scheduler.new(stall: 0.1, on_stall: ->(report) { reports << report })
    waits = fired = nil
    begin
      Fiber.set_scheduler(scheduler)
      reader, writer = IO.pipe
      Fiber.schedule { reader.read(1) }
      Fiber.schedule do
        waits = Fiber.scheduler.fibers.map(&:wait)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
        nil until reports.any? { |report| report.state == :ongoing } || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        5.times { sleep 0.001 }
        fired = Fiber.scheduler.stats[:timers_fired]
        writer.write("x")
      end
    ensure
      Fiber.set_scheduler(nil)
    end
    found = reports.dup
    [found.map(&:state), found.any? { |report| report.backtrace&.any? { |frame| frame.include?("insight'") } },
     waits.compact.sort, fired]
  end

  # A thread of this Ractor closes an IO a fiber of this Ractor waits on.
  def close_from_thread
    error = nil
    run do
      reader, writer = IO.pipe
      Fiber.schedule { reader.read(1) rescue error = [$!.class.name, $!.message] }
      Fiber.schedule { Thread.new { reader.close }.join; writer.close }
    end
    error
  end
end

class RactorTest < Minitest::Test
  include EvtTest
  include QuietRactors

  # Ruby 3.3 and 3.4 corrupt their fiber-stack pool when fibers start or end in two Ractors at
  # once, with or without a scheduler (test/support/ractor_fibers_crash.rb shows it; fixed in Ruby
  # 4.0 by ruby/ruby#13466). Tests with loops in several Ractors at once run where that is fixed.
  RUBY_FIBERS_IN_PARALLEL_RACTORS = Evt::Workers::PARALLEL_RACTOR_FIBERS

  def skip_unless_parallel_fibers
    return if RUBY_FIBERS_IN_PARALLEL_RACTORS

    skip "Ruby #{RUBY_VERSION} crashes with fibers in several Ractors at once (ruby/ruby#13466; " \
         "test/support/ractor_fibers_crash.rb)"
  end

  def test_a_loop_in_a_ractor_runs_sleeping_fibers_in_deadline_order
    scheduler, woke = RactorWork.in_ractor(:sleeps)
    assert_nil scheduler, "the scheduler is the Ractor's thread's, and Evt.run takes it away again"
    assert_equal [0.01, 0.02, 0.03], woke
  end

  def test_stall_reports_fibers_and_stats_in_a_ractor
    states, named, waits, fired = RactorWork.in_ractor(:insight)
    assert_equal %i[ended ongoing], states.uniq.sort
    assert named, "no report's backtrace was in the spinning fiber"
    assert_equal %i[io], waits
    assert_equal 5, fired
  end

  def test_sockets_pipes_and_files_in_a_ractor
    assert_equal Array.new(20) { |i| "HELLO #{i}\n" }, RactorWork.in_ractor(:tcp_echo)
    assert_equal "part 0;part 1;part 2;", RactorWork.in_ractor(:pipe)
    Dir.mktmpdir do |dir|
      assert_equal "written in a Ractor", RactorWork.in_ractor(:file, File.join(dir, "file"))
    end
  end

  def test_timeout_queue_mutex_and_condition_in_a_ractor
    assert_equal "Timeout::Error", RactorWork.in_ractor(:timeout)
    assert_equal [0, 1, 2], RactorWork.in_ractor(:queue)
    assert_equal %i[signal woken], RactorWork.in_ractor(:mutex_and_condition)
  end

  def test_close_in_a_ractor_wakes_the_fibers_waiting_on_the_io
    closed = ["IOError", "stream closed in another thread"]
    assert_equal [closed, closed], RactorWork.in_ractor(:close_wakes_waiters)
    assert_equal closed, RactorWork.in_ractor(:close_from_thread)
  end

  def test_process_waits_and_name_resolution_in_a_ractor
    assert_equal [3, true], RactorWork.in_ractor(:process_wait)
    assert_includes RactorWork.in_ractor(:resolve), "127.0.0.1"
  end

  # On Ruby 3.3 and 3.4 some of those loops are refused (another Ractor has one open): never a crash.
  def test_ractors_make_and_drop_loops_and_close_ios_at_once
    ractors = Array.new(4) { Ractor.new { RactorWork.loops_and_closes(500) } }
    counts = [RactorWork.loops_and_closes(500), *ractors.map { |ractor| RactorWork.answer(ractor) }]
    GC.start # the loops left to the GC are open until collected: on 3.3 and 3.4 they bar other Ractors
    assert_equal [500] * 5, counts.map(&:sum)
    assert_equal [0] * 5, counts.map(&:last) if RUBY_FIBERS_IN_PARALLEL_RACTORS
  end

  # The pure-Ruby loop's IO#close and #read_nonblock watches are on IO as soon as it loads, in the
  # main Ractor: made by the first loop instead, Ractors starting loops at once would prepend to IO
  # at once, which crashed Ruby 3.3 about once in 30 runs of the test above.
  def test_the_pure_ruby_loop_watches_io_from_its_load_not_from_a_loop
    out, status = run_ruby(<<~RUBY, limit: 60)
      ENV["EVT_NO_EXTENSION"] = "1"
      ENV.delete("EVT_BACKEND") # whatever backend this run tests, the child is the pure-Ruby loop
      require "evt"
      watches = -> { IO.ancestors.map(&:name).select { |name| name.to_s.start_with?("Evt::SelectLoop::") } }
      before = watches.call
      Evt::Scheduler.new.close
      print [Evt.extension?, before, before == watches.call].inspect
    RUBY
    assert status&.success?, out
    assert_equal [false, %w[Evt::SelectLoop::CloseWatch Evt::SelectLoop::ReadNonblockWatch], true].inspect, out
  end

  # Where fibers in two Ractors at once crash Ruby, evt refuses a loop in a second Ractor while
  # another Ractor's is open, saying why; once it is closed, the second Ractor's turn comes.
  def test_a_second_ractors_loop_is_refused_where_ruby_would_crash
    skip "Ruby #{RUBY_VERSION} runs loops in several Ractors at once" if RUBY_FIBERS_IN_PARALLEL_RACTORS
    skip "the pure-Ruby loop is not held to one Ractor at a time (docs/workers.md)" unless Evt.extension?
    scheduler = Evt::Scheduler.new
    error = assert_raises(Evt::RactorError) { RactorWork.in_ractor(:sleeps) }
    assert_match(%r{\Aevt: a loop of another Ractor is open, and Ruby 3\.\d crashes when fibers run in two Ractors at once \(ruby/ruby#13466, fixed in Ruby 4\.0\)},
                 error.message)
    scheduler.close
    assert_equal [0.01, 0.02, 0.03], RactorWork.in_ractor(:sleeps).last
  ensure
    scheduler&.close
  end

  def test_loops_in_several_ractors_at_once
    skip_unless_parallel_fibers
    ractors = Array.new(4) { Ractor.new { [RactorWork.tcp_echo(200), RactorWork.close_wakes_waiters] } }
    ractors.each do |ractor|
      answers, errors = RactorWork.answer(ractor)
      assert_equal Array.new(200) { |i| "HELLO #{i}\n" }, answers
      assert_equal 2, errors.size
    end
  end

  # The main Ractor's loops go on while other Ractors run theirs, and an IO#close here looks only
  # at this Ractor's loops.
  def test_the_main_ractors_loop_runs_beside_ractors
    skip_unless_parallel_fibers
    ractor = Ractor.new { RactorWork.tcp_echo(300) }
    assert_equal Array.new(300) { |i| "HELLO #{i}\n" }, RactorWork.tcp_echo(300)
    assert_equal [["IOError", "stream closed in another thread"]] * 2, RactorWork.close_wakes_waiters
    assert_equal 300, RactorWork.answer(ractor).size
  end
end
