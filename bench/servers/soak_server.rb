# frozen_string_literal: true

# soak, the server side: one evt loop under every kind of work at once, for as long as bin/bench
# keeps it running. HTTP (bin/bench drives it with wrk, keep-alive and Connection: close); pipe pairs
# ping-ponging messages whose content both ends check; fibers sleeping short random times;
# Timeout.timeout around waits that must and waits that need not time out; Ruby threads feeding
# Thread::SizedQueues that fibers pop; and IO#close, from another fiber and from another thread, of
# pipes that fibers are reading or writing, whose waiters must raise IOError. Every surprise counts
# as an error (the first few distinct ones are kept as samples), and a fiber that stops making
# progress is reported as stalled.
#
#   ruby bench/servers/soak_server.rb SUBJECT [--paced]   (prints "listening on PORT" first)
#
# --paced (bin/bench --soak-rate): the activities that would otherwise run flat out (ping-pong, the
# producer threads, the close rounds, the Timeout rounds) rest between rounds, so the server has CPU
# to spare and a row's figures measure the server rather than how much CPU the machine gave it.
#
# Then bin/bench talks to it on stdin and stdout, a line each way:
#   sample  the fibers that open and close pipes stop where they hold the same ones every time,
#           and the HTTP connections wrk left must end, so that the descriptors open are the
#           steady ones; then the counters, as JSON
#   resume  those fibers go on
# The end of stdin ends the process.
require "json"
require "socket"
require "timeout"
require_relative "../subject"
require_relative "http_handler"

module Bench
  # The activities, their counters and their errors. Everything but the Ruby threads runs on the
  # loop's thread, so the counters need no lock; the threads hand their errors over in a queue.
  class Soak
    PINGPONG_PAIRS = 8
    SLEEPERS = 40
    TIMEOUT_FIBERS = 8
    PRODUCERS = 2 # Ruby threads, each feeding QUEUES_PER_PRODUCER queues
    QUEUES_PER_PRODUCER = 2
    FIBER_CLOSE_SLOTS = 4
    THREAD_CLOSE_SLOTS = 2 # each with a Ruby thread of its own that does the closes
    WAKE_LIMIT = 5.0 # seconds a closed IO's waiters may take to raise before they count as hung
    STALL_LIMIT = 10.0 # seconds without progress before an activity's fiber counts as stalled
    SETTLE_LIMIT = 15.0 # seconds a sample waits for the pipe-making fibers to park and HTTP to drain
    # A wait may end this much before its time without counting as early. evt reads the monotonic
    # clock afresh for each deadline (it keeps no time per loop turn, as libuv does), so only the
    # rounding of a Float duration to nanoseconds is left; this is far beyond it.
    EARLY = 0.0001
    SAMPLES = 10 # distinct error messages kept, with their counts
    # Ping-pong messages are slices of this: both ends compute the n-th message on their own.
    PAYLOAD = Random.new(1).bytes(256 * 1024).freeze

    # The HTTP load bin/bench drives the server with: two wrk at once, [connections, headers].
    LOADS = [[50, []], [20, ["-H", "Connection: close"]]].freeze
    # With --paced: seconds each activity rests after a round (producers: at most, between bursts).
    PACED_REST = {pipes: 0.004, produce: 0.02, close: 0.02, timeout: 0.004}.freeze

    def initialize(server, paced: false)
      @server = server
      @rest = paced ? PACED_REST : {produce: 0.002}
      @counts = %i[requests pipes sleeps timeouts_done timeouts_fired queued closes woken errors].to_h { |k| [k, 0] }
      @samples = {} # "activity: message" => count, for the first SAMPLES distinct messages
      @thread_errors = Thread::Queue.new # [activity, message] from the Ruby threads
      @beats = {} # fiber name => when it last made progress
      @stalled = {} # fiber names already reported as stalled
      @late = 0.0 # the latest a sleeper woke since the last sample, seconds
      @connections = 0
      @paused = false
      @parked = 0 # fibers stopped at their pause point
    end

    def start
      Fiber.schedule { http }
      PINGPONG_PAIRS.times { |i| Fiber.schedule { forever(:pipes) { pingpong("pipe pair #{i}") } } }
      SLEEPERS.times { |i| Fiber.schedule { forever(:sleep) { sleeper("sleeper #{i}", Random.new(i)) } } }
      TIMEOUT_FIBERS.times { |i| Fiber.schedule { forever(:timeout) { timeouts("timeout #{i}", Random.new(i)) } } }
      queues
      FIBER_CLOSE_SLOTS.times { |i| Fiber.schedule { forever(:close) { fiber_closes("fiber close #{i}", Random.new(i)) } } }
      THREAD_CLOSE_SLOTS.times { |i| Fiber.schedule { forever(:close) { thread_closes("thread close #{i}", Random.new(100 + i)) } } }
    end

    # Answers bin/bench until it closes stdin, then ends the process at once: the fibers would wait
    # forever, and a fiber that hung on a close could not be ended anyway.
    def control(input, output)
      while (line = input.gets)
        case line.chomp
        when "sample"
          output.puts JSON.generate(sample_or_why_not)
          output.flush
        when "resume" then @paused = false
        end
      end
      exit!(0)
    end

    private

    def sample_or_why_not
      sample
    rescue StandardError => e # a bug here must not leave bin/bench waiting
      {fatal: "#{e.class}: #{e.message}"}
    end

    # ---- the activities ---------------------------------------------------------------------

    # Every connection on a fiber of its own, as bench/servers/http_server.rb; requests counted as served.
    def http
      loop do
        client = @server.accept
        @connections += 1
        Fiber.schedule do
          HTTPHandler.serve(client) { @counts[:requests] += 1 }
        rescue StandardError => e
          error(:http, e)
        ensure
          @connections -= 1
        end
      rescue StandardError => e
        error(:http, e) # accept failed (EMFILE would be a leak elsewhere); go on accepting
        sleep 0.01
      end
    end

    # One pipe each way; this fiber sends the n-th message, an echo fiber checks it and sends it
    # back, this fiber checks the echo. Small messages mostly, every 16th larger than a pipe holds.
    # A failure on either side ends the pair (counted once, here) and a new pair starts. Reads go
    # into buffers kept for the pair: the kernel (or the ring) writes into the same memory again and
    # again, and RSS shows the process's memory rather than malloc's churn of 128 KiB strings.
    def pingpong(name)
      there_r, there_w = IO.pipe
      back_r, back_w = IO.pipe
      echo_failure = nil
      Fiber.schedule do
        echo(there_r, back_w)
      rescue StandardError => e
        echo_failure = e
        back_w.close # this fiber then reads the end of file, and reports why
      end
      sequence = 0
      header = String.new(capacity: 4)
      echoed = String.new(capacity: MESSAGE_MAX)
      loop do
        pause_point(name)
        body = message(sequence)
        there_w.write([body.bytesize].pack("N"), body)
        back_r.read(4, header)
        back_r.read(body.bytesize, echoed)
        unless header.bytesize == 4 && header.unpack1("N") == body.bytesize && echoed == body
          raise "#{name}: echo: #{echo_failure.class}: #{echo_failure.message}" if echo_failure

          raise "#{name}: the echo of message #{sequence} differs (#{echoed.bytesize} bytes)"
        end
        sequence += 1
        @counts[:pipes] += 1
        beat(name)
        rest(:pipes)
      end
    ensure
      [there_r, there_w, back_r, back_w].each { |io| io&.close }
    end

    def echo(input, output)
      sequence = 0
      header = String.new(capacity: 4)
      body = String.new(capacity: MESSAGE_MAX)
      loop do
        input.read(4, header) or raise "end of file before message #{sequence}"
        input.read(header.unpack1("N"), body) or raise "end of file in message #{sequence}"
        raise "message #{sequence} differs (#{body.bytesize} bytes)" unless body == message(sequence)

        output.write(header, body)
        sequence += 1
      end
    end

    MESSAGE_MAX = 131_072

    def message(sequence)
      length = (sequence % 16).zero? ? 65_536 + (sequence * 7919) % 65_536 : 1 + (sequence * 7919) % 4096
      PAYLOAD.byteslice((sequence * 104_729) % (PAYLOAD.bytesize - length), length)
    end

    # Sleeps of 0-10 ms: none may end early; how late they end is reported.
    def sleeper(name, random)
      loop do
        delay = random.rand * 0.01
        started = clock
        sleep delay
        slept = clock - started
        error(:sleep, format("sleep(%.4f) ended %.3f ms early", delay, (delay - slept) * 1e3)) if slept < delay - EARLY
        @late = slept - delay if slept - delay > @late
        @counts[:sleeps] += 1
        beat(name)
      end
    end

    # Timeout.timeout(2-10 ms) around: a sleep a quarter as long (it may time out on a busy loop,
    # which is no error), and three waits that must time out — a sleep four times as long, a pop
    # of a queue nobody feeds, a read of a pipe nobody writes. After that read the pipe must still
    # carry the next byte to the next read: a cancelled read must not have taken it. An exception
    # is an error; the pipe, which it may have left in any state, is replaced at once.
    def timeouts(name, random)
      pipe = IO.pipe
      silent = Thread::Queue.new
      loop do
        pause_point(name)
        kind = TIMEOUT_WAITS[random.rand(TIMEOUT_WAITS.size)]
        begin
          timeout_round(kind, 0.002 + random.rand * 0.008, pipe, silent)
        rescue StandardError => e
          error(:timeout, "#{kind}: #{e.class}: #{e.message}")
          pipe.each(&:close)
          pipe = IO.pipe
        end
        beat(name)
        rest(:timeout)
      end
    ensure
      pipe&.each(&:close)
    end

    TIMEOUT_WAITS = ["shorter sleep", "longer sleep", "Queue#pop", "pipe read"].freeze

    def timeout_round(kind, limit, (r, w), silent)
      case kind
      when "shorter sleep" then bounded(limit, must_fire: false) { sleep limit / 4 }
      when "longer sleep" then bounded(limit, must_fire: true) { sleep limit * 4 }
      when "Queue#pop" then bounded(limit, must_fire: true) { silent.pop }
      else
        bounded(limit, must_fire: true) { r.read(1) }
        w.write("x")
        byte = Timeout.timeout(WAKE_LIMIT) { r.read(1) }
        raise "after a timed-out read the pipe gave #{byte.inspect}, not \"x\"" unless byte == "x"
      end
    end

    def bounded(limit, must_fire:)
      started = clock
      fired = begin
        Timeout.timeout(limit) { yield }
        false
      rescue Timeout::Error
        true
      end
      waited = clock - started
      error(:timeout, format("Timeout.timeout(%.4f) fired after %.4f s", limit, waited)) if fired && waited < limit - EARLY
      error(:timeout, format("Timeout.timeout(%.4f) did not fire around a longer wait", limit)) if must_fire && !fired
      @counts[fired ? :timeouts_fired : :timeouts_done] += 1
    end

    # Each Ruby thread pushes numbered items, in bursts with short sleeps between (so the loop is
    # sometimes busy, sometimes waiting in the kernel when the unblock comes), into its queues; a
    # fiber per queue pops them and checks that none is lost or out of order.
    def queues
      all = Array.new(PRODUCERS * QUEUES_PER_PRODUCER) { Thread::SizedQueue.new(64) }
      all.each_with_index { |queue, i| Fiber.schedule { forever(:queue) { consume("queue #{i}", queue) } } }
      all.each_slice(QUEUES_PER_PRODUCER).with_index do |mine, i|
        Thread.new { produce(mine, Random.new(i)) }
      end
    end

    def produce(queues, random)
      numbers = Array.new(queues.size, 0)
      loop do
        i = random.rand(queues.size)
        random.rand(1..16).times { queues[i].push(numbers[i] += 1) }
        sleep random.rand * @rest[:produce]
      end
    rescue StandardError => e
      @thread_errors.push([:queue, "producer thread: #{e.class}: #{e.message}"])
    end

    def consume(name, queue)
      expected = 1
      loop do
        item = queue.pop
        error(:queue, "#{name}: popped #{item}, expected #{expected}") unless item == expected
        expected = item + 1
        @counts[:queued] += 1
        beat(name)
      end
    end

    # ---- IO#close of waited IOs ---------------------------------------------------------------

    # The waits a close must end with IOError, on the read end and on the write end of a full pipe.
    READ_WAITS = {"read" => ->(io) { io.read(1) }, "gets" => ->(io) { io.gets },
                  "wait_readable" => ->(io) { io.wait_readable }}.freeze
    WRITE_WAITS = {"write" => ->(io) { io.write("y" * 4096) }, "wait_writable" => ->(io) { io.wait_writable }}.freeze

    # Rounds in which this fiber closes the pipe end the other fibers wait on, after 0-5 ms.
    def fiber_closes(name, random)
      loop do
        pause_point(name)
        close_round(name, random) do |io|
          sleep random.rand * 0.005
          io.close
        end
      end
    end

    # Rounds in which a Ruby thread of this slot's own does the close, after 0-5 ms.
    def thread_closes(name, random)
      requests = Thread::Queue.new
      closer = Thread.new do
        while (io, delay, done = requests.pop)
          begin
            sleep delay
            io.close
            done.push(nil)
          rescue StandardError => e
            done.push("#{e.class}: #{e.message}")
          end
        end
      end
      loop do
        pause_point(name)
        close_round(name, random) do |io|
          done = Thread::Queue.new
          requests.push([io, random.rand * 0.005, done])
          problem = done.pop
          error(:close, "#{name}: the closing thread got #{problem}") if problem
        end
      end
    ensure
      requests&.close
      closer&.join
    end

    # A fresh pipe, fibers waiting on one end of it, the block closing that end; every waiter must
    # raise IOError within WAKE_LIMIT. A waiter that does not is a hang: it is left behind (its IO
    # is closed; nothing of it stays open) and the next round goes on.
    def close_round(name, random)
      r, w = IO.pipe
      side, waits = random.rand(2).zero? ? [r, READ_WAITS] : [w, WRITE_WAITS]
      fill(w) if side == w
      outcomes = Thread::Queue.new
      waits.each { |what, wait| Fiber.schedule { outcomes.push(outcome(what, side, wait)) } }
      yield side
      waits.size.times do |n|
        problem = Timeout.timeout(WAKE_LIMIT) { outcomes.pop }
        if problem
          error(:close, "#{name}: #{problem}")
        else
          @counts[:woken] += 1
        end
      rescue Timeout::Error
        break error(:close, "#{name}: #{waits.size - n} of #{waits.size} waiters still waiting #{WAKE_LIMIT} s after the close")
      end
      @counts[:closes] += 1
      beat(name)
      rest(:close)
    ensure
      r&.close
      w&.close
    end

    def fill(w)
      loop { w.write_nonblock("f" * 65_536) }
    rescue IO::WaitWritable
      nil
    end

    # nil when the wait ended with IOError, as it must; else what happened instead.
    def outcome(what, io, wait)
      result = wait.call(io)
      "#{what} returned #{result.inspect[0, 40]} after the close, not IOError"
    rescue IOError
      nil
    rescue StandardError => e
      "#{what} raised #{e.class} (#{e.message}), not IOError"
    end

    # Where the fibers that make and close descriptors stop while bin/bench samples, each then
    # holding the same descriptors as at every other sample: a close slot none (between rounds), a
    # ping-pong pair its four, a Timeout fiber its two.
    def pause_point(name)
      return unless @paused

      @parked += 1
      begin
        while @paused
          sleep 0.001
          beat(name)
        end
      ensure
        @parked -= 1
      end
    end

    # ---- counting -----------------------------------------------------------------------------

    # Runs the block again and again; an exception ending it is an error, and the next turn starts
    # afresh (a short pause first, so that a failure that repeats cannot spin the loop).
    def forever(activity)
      loop do
        yield
      rescue StandardError => e
        error(activity, e)
        sleep 0.01
      end
    end

    def error(activity, problem)
      @counts[:errors] += 1
      text = "#{activity}: #{problem.is_a?(Exception) ? "#{problem.class}: #{problem.message}" : problem}"
      @samples[text] = @samples.fetch(text, 0) + 1 if @samples.key?(text) || @samples.size < SAMPLES
      nil
    end

    def beat(name)
      @beats[name] = clock
    end

    # Paced, the rest after a round of `activity`; unpaced, none.
    def rest(activity)
      seconds = @rest[activity]
      sleep seconds if seconds
    end

    # The counters, once the close rounds have paused and the connections wrk left have ended.
    def sample
      @paused = true
      deadline = clock + SETTLE_LIMIT
      sleep 0.001 until settled? || clock > deadline
      unless settled?
        error(:sample, "not settled after #{SETTLE_LIMIT} s: #{@parked} of #{parkers} fibers paused, " \
                       "#{@connections} connections open")
      end
      error(*@thread_errors.pop) until @thread_errors.empty?
      stalls
      # bin/bench reads RSS next: what stays, not garbage not yet collected (as idle_server.rb), nor
      # memory malloc holds free. Process.warmup is a full GC, a compaction (which moves the objects
      # evt's C holds: a test of its own), and malloc_trim.
      Process.warmup
      # Ruby's objects alive after that full GC: growing while RSS grows is objects kept (by the
      # program or by evt); RSS growing alone is memory outside Ruby's heap, whose pages (kB) the
      # sample gives too.
      figures = @counts.merge(connections: @connections, late_ms: (@late * 1e3).round(2), samples: @samples,
                              live_objects: GC.stat(:heap_live_slots),
                              heap_kb: GC.stat(:heap_allocated_pages) * GC::INTERNAL_CONSTANTS[:HEAP_PAGE_SIZE] / 1024)
      @late = 0.0
      figures
    end

    def settled?
      @parked == parkers && @connections.zero?
    end

    def parkers
      PINGPONG_PAIRS + TIMEOUT_FIBERS + FIBER_CLOSE_SLOTS + THREAD_CLOSE_SLOTS
    end

    # Each fiber that has made no progress for STALL_LIMIT, once.
    def stalls
      now = clock
      @beats.each do |name, at|
        next if now - at < STALL_LIMIT || @stalled[name]

        @stalled[name] = true
        error(:stall, format("%s made no progress for %.0f s", name, now - at))
      end
    end

    def clock
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end

if $PROGRAM_NAME == __FILE__
  subject = ARGV.fetch(0) { abort "usage: soak_server.rb evt-<backend> [--paced]" }
  server = TCPServer.new("127.0.0.1", 0)
  server.listen(1024)
  $stdout.puts "listening on #{server.local_address.ip_port}"
  $stdout.flush
  Bench::Subject.run(subject) do
    soak = Bench::Soak.new(server, paced: ARGV[1] == "--paced")
    soak.start
    soak.control($stdin, $stdout)
  end
end
