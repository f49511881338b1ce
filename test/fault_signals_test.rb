# frozen_string_literal: true

require "test_helper"

# Fault: signals arrive in a storm while fibers wait. Each signal interrupts the loop's wait in the
# kernel (EINTR) and makes Ruby run a trap handler; the loop must run the handlers, go back to
# waiting, and lose nothing: every fiber finishes with its exact data, and Errno::EINTR never
# reaches Ruby code.
class FaultSignalsTest < Minitest::Test
  SIGNALS = %w[USR1 USR2].freeze
  STORM = 30_000 # at most, per sender: the storm stops once the fibers are done

  def evt(timeout: 20, &block)
    super
  end

  # Counts each trapped signal while the block runs; restores the previous handlers after.
  def trapping(on_signal = nil)
    counts = Hash.new(0)
    previous = SIGNALS.to_h do |name|
      [name, trap(name) do
        counts[name] += 1
        on_signal&.call(name)
      end]
    end
    yield counts
    counts
  ensure
    previous&.each { |name, handler| trap(name, handler || "DEFAULT") }
  end

  # Runs +body+ in a fiber; whatever it raises (an EINTR above all) is kept in +errors+, since an
  # exception would only end that fiber.
  def fiber(errors, &body)
    Fiber.schedule do
      body.call
    rescue Exception => e # rubocop:disable Lint/RescueException
      errors << e
    end
  end

  # Sends USR1 and USR2 to +pid+, alternately and as fast as it can, until +limit+ are sent or the
  # block (asked every few signals) says stop; returns how many it sent.
  def send_signals(pid, limit)
    sent = 0
    while sent < limit
      Process.kill(SIGNALS[sent % 2], pid)
      sent += 1
      break if (sent % 32).zero? && yield
    end
    sent
  end

  # A storm from two senders: a child process, and a thread of this process (whose signals may land
  # on any thread), each sending at most +limit+. Both start when the returned go lambda is called;
  # the stop lambda ends them and gives [signals sent, the child's exit status].
  def storm(limit = STORM)
    go_r, go_w = IO.pipe
    stop_r, stop_w = IO.pipe
    report_r, report_w = IO.pipe
    parent = Process.pid
    pid = fork do
      [go_w, stop_w, report_r].each(&:close)
      SIGNALS.each { |name| trap(name, "IGNORE") } # the parent's handlers are no business of the child
      go_r.read(1)
      report_w.write(send_signals(parent, limit) { stop_r.read_nonblock(1, exception: false) != :wait_readable }.to_s)
      exit!(0)
    end
    [go_r, stop_r, report_w].each(&:close)
    stopping = false
    started = Thread::Queue.new
    thread = Thread.new do
      started.pop
      send_signals(parent, limit) { Thread.pass || stopping }
    end
    go = lambda do
      go_w.write("g")
      started << true
    end
    stopped = nil
    stop = lambda do
      stopped ||= begin
        stopping = true
        started << true # (if go never came)
        [go_w, stop_w].each(&:close) # EOF: the child stops (or never starts)
        sent = report_r.read.to_i
        _, status = Process.wait2(pid)
        report_r.close
        [sent + thread.value.to_i, status]
      end
    end
    [go, stop]
  end

  def test_a_storm_of_signals_while_fibers_wait_on_pipes_sockets_sleeps_and_queues
    errors = []
    results = Hash.new { |hash, key| hash[key] = [] }
    expected = {}
    sent = child_status = nil
    counts = trapping do
      go, stop = storm
      evt do
        go.call

        # Pipes: many small writes, each after a sleep, read line by line.
        8.times do |i|
          r, w = IO.pipe
          lines = Array.new(40) { |k| "pipe #{i} line #{k}\n" }
          expected[[:pipe, i]] = lines
          fiber(errors) do
            while (line = r.gets)
              results[[:pipe, i]] << line
            end
            r.close
          end
          fiber(errors) do
            lines.each do |line|
              sleep 0.0005
              w.write(line)
            end
            w.close
          end
        end
        # A transfer larger than the pipe: reads and writes cut short and resumed many times.
        big = Random.new(42).bytes(2_000_000)
        expected[:big] = [big.hash]
        big_r, big_w = IO.pipe
        big_r.binmode
        fiber(errors) do
          results[:big] << big_r.read.hash # a digest: a diff of two megabytes helps nobody
          big_r.close
        end
        fiber(errors) do
          big_w.write(big)
          big_w.close
        end
        # Sockets: request and reply, UNIX and TCP.
        server = TCPServer.new("127.0.0.1", 0)
        pairs = Array.new(4) { UNIXSocket.pair } +
                Array.new(4) { [Socket.tcp("127.0.0.1", server.local_address.ip_port), server.accept] }
        server.close
        pairs.each_with_index do |(a, b), i|
          expected[[:socket, i]] = Array.new(30) { |k| "#{i}:#{k}".upcase }
          fiber(errors) do
            while (line = b.gets)
              b.write(line.upcase)
            end
            b.close
          end
          fiber(errors) do
            30.times do |k|
              a.write("#{i}:#{k}\n")
              results[[:socket, i]] << a.gets.chomp
            end
            a.close
          end
        end
        # Sleeps, counted.
        8.times do |i|
          expected[[:sleep, i]] = [60]
          fiber(errors) do
            60.times { sleep 0.0005 }
            results[[:sleep, i]] << 60
          end
        end
        # Queues fed by another thread: each pop is a cross-thread unblock.
        queues = Array.new(8) { Thread::Queue.new }
        queues.each_with_index do |queue, i|
          expected[[:queue, i]] = Array.new(40) { |k| [i, k] }
          fiber(errors) { 40.times { results[[:queue, i]] << queue.pop } }
        end
        producer = Thread.new do
          40.times do |k|
            queues.each_with_index { |queue, i| queue << [i, k] }
            sleep 0.0005
          end
        end
        # A child process waited for, and a read under Timeout.timeout, both done within the storm.
        expected[:child] = [3]
        fiber(errors) do
          pid = fork do
            IO.select(nil, nil, nil, 0.02)
            exit!(3)
          end
          results[:child] << Process.wait2(pid)[1].exitstatus
        end
        expected[:timeout] = ["in time"]
        timeout_r, timeout_w = IO.pipe
        fiber(errors) { results[:timeout] << Timeout.timeout(10) { timeout_r.read(7) } }
        fiber(errors) do
          sleep 0.01
          timeout_w.write("in time")
        end

        # Once every fiber above has its data, the storm ends (its child waited for in a fiber).
        fiber(errors) do
          sleep 0.001 until expected.all? { |key, value| results.fetch(key, []).size == value.size }
          sent, child_status = stop.call
          producer.join
        end
      end
    ensure
      stop&.call
      sleep 0.05 # signals still pending run the handlers being restored, not the default action
    end

    assert_empty errors.map { |e| "#{e.class}: #{e.message}" }, "an error reached a fiber"
    assert_equal expected.keys.sort_by(&:to_s), results.keys.sort_by(&:to_s)
    expected.each { |key, value| assert_equal value, results[key], "#{key.inspect} lost or garbled data" }
    assert_predicate child_status, :success?
    assert_operator sent, :>=, 1000, "hardly a storm: the fibers finished first"
    # The same signal pending twice is delivered once: handlers run at most once per signal sent.
    assert_operator counts.values.sum, :<=, sent
    SIGNALS.each { |name| assert_operator counts[name], :>=, 1, "no #{name} handler ran" }
  end

  # One signal at a time, each sent only once the handler of the previous one ran, while every fiber
  # waits with nothing due for a minute: each signal alone must end the loop's wait and run its
  # handler (a lost wakeup stalls the exchange). Exactly as many handlers as signals.
  def test_each_signal_ends_the_wait_and_its_handler_runs_exactly_once
    rounds = 300
    acks = Thread::Queue.new
    errors = []
    finished = []
    trapping(->(name) { acks << name }) do |counts|
      evt do
        r, w = IO.pipe
        a, b = UNIXSocket.pair
        queue = Thread::Queue.new
        select_r, select_w = IO.pipe # its own: a reader on the same pipe could take the data first
        fiber(errors) { finished << r.read(4) }
        fiber(errors) { finished << a.read(4) }
        fiber(errors) { finished << queue.pop }
        fiber(errors) { finished << IO.select([select_r], nil, nil, 60)&.first&.size }
        sender = Thread.new do
          rounds.times do |k|
            Process.kill(SIGNALS[k % 2], Process.pid)
            acks.pop
          end
        end
        fiber(errors) do
          sender.join # through the scheduler: the thread's end unblocks it
          w.write("done")
          b.write("done")
          queue << "done"
          select_w.write("x")
        end
      end
    rescue Timeout::Error
      flunk "a signal did not end the loop's wait: #{counts.values.sum} of #{rounds} handled"
    else
      assert_equal({"USR1" => rounds / 2, "USR2" => rounds / 2}, counts.to_h)
    end
    assert_empty errors.map { |e| "#{e.class}: #{e.message}" }
    assert_equal ["done"] * 3, finished.grep(String)
    assert_equal [1], finished.grep(Integer)
  end

  # The self-pipe pattern: each handler writes a byte to a pipe a fiber reads. The handlers run in
  # whichever fiber is current when the signal is taken, the loop's own included, so the write may
  # happen in the middle of evt (a sleep, a read, the wait itself): every byte must arrive, once.
  # A bounded storm: handlers that cost a system call each can be outpaced by an endless one, and
  # then the main thread, which runs them all, does nothing else, with or without a scheduler.
  def test_trap_handlers_that_write_to_a_pipe_in_a_storm
    r, w = IO.pipe
    received = 0
    errors = []
    handler_errors = []
    sent = nil
    write = lambda do |_name|
      w.write("x")
    rescue StandardError => e # kept, not raised into whatever code the signal interrupted
      handler_errors << e
    end
    counts = trapping(write) do
      go, stop = storm(5_000) # at most 10,000 bytes: never a full pipe
      evt do
        reader = fiber(errors) do
          while (data = r.readpartial(4096))
            received += data.count("x")
            break if data.end_with?("!")
          end
        end
        sleepers = Array.new(20) { fiber(errors) { 100.times { sleep 0.0005 } } }
        go.call
        sleep 0.001 while sleepers.any?(&:alive?)
        sent, = stop.call # waits for the storm to end
        sleep 0.02 # the last pending handlers run
        w.write("!")
        sleep 0.001 while reader.alive?
      end
    ensure
      stop&.call
      sleep 0.05 # signals still pending run the handlers being restored, not the default action
    end
    # Every write is over once the loop is: none may still hold the pipe's write lock.
    leftover = begin
      w.write("z")
      nil
    rescue ThreadError => e
      e
    end
    assert_nil leftover, "a fiber still holds the pipe's write lock after the loop ended"
    assert_empty errors.map { |e| "#{e.class}: #{e.message}" }
    assert_empty handler_errors.map { |e| "#{e.class}: #{e.message}" }.tally, "handlers' writes raised"
    assert_operator counts.values.sum, :>=, 2
    assert_operator counts.values.sum, :<=, sent
    assert_equal counts.values.sum, received, "a handler's write was lost or doubled"
  ensure
    [r, w].each { |io| io&.close }
  end

  # A trap handler runs on whichever fiber is current: often the one that drives the loop (a signal
  # taken while the loop waits in the kernel), which is blocking and cannot wait for a lock. A fiber
  # that has just written a byte to a pipe with room must not still hold that pipe's write lock
  # there (as the writer of a full pipe would): without a scheduler the write is over at once, and
  # the handler's own write to the same pipe (the self-pipe pattern, or $stdout with sync = true)
  # goes through. Self-sent, the signal is handled at once, on the root fiber, here.
  def test_a_handler_on_the_loop_fiber_writes_to_a_pipe_a_fiber_just_wrote_to
    r, w = IO.pipe
    errors = []
    previous = trap("USR1") do
      w.write("t")
    rescue StandardError => e
      errors << e
    end
    Timeout.timeout(10) do
      Fiber.set_scheduler(Evt::Scheduler.new)
      Fiber.schedule { w.write("a") }
      Process.kill(:USR1, Process.pid)
    ensure
      Fiber.set_scheduler(nil)
    end
    assert_empty errors.map { |e| "#{e.class}: #{e.message}" }
    assert_equal %w[a t], r.read_nonblock(10).chars.sort
  ensure
    trap("USR1", previous || "DEFAULT")
    [r, w].each { |io| io&.close }
  end
end
