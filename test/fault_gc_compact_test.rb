# frozen_string_literal: true

require "test_helper"
require "io/wait"

# Fault: the garbage collector compacts the heap while thousands of fibers wait. Everything the loop
# holds for a waiting fiber — the fiber, its IO, its buffer (half filled, on io_uring in the ring),
# the blocker of a Queue pop, a Timeout's exception class — may be moved, or must be pinned; after
# compaction every fiber completes with its exact data.
class FaultGCCompactTest < Minitest::Test
  PIPES = 400       # readers, each half way through a read when the heap is compacted
  SOCKETS = 200     # UNIX socket pairs, a reader each
  WRITERS = 100     # writers waiting on a full pipe
  SLEEPERS = 1000
  POPPERS = 800
  TIMEOUTS = 200    # reads under Timeout.timeout

  def evt(timeout: 30, &block)
    super
  end

  def setup
    skip "GC.compact is not supported by this Ruby" unless GC.respond_to?(:compact)
    # Some builds define GC.compact and raise when it is called (no mprotect / read barrier support).
    GC.compact
  rescue NotImplementedError => e
    skip "GC.compact is not supported here: #{e.message}"
  end

  # Compacts twice, the second time moving every object that can move (toward: :empty) and checking
  # that no reference was left pointing at an old address.
  def compact
    GC.start(full_mark: true, immediate_sweep: true)
    GC.compact
    GC.verify_compaction_references(expand_heap: true, toward: :empty)
  end

  def test_thousands_of_waiting_fibers_complete_with_their_data_after_compaction
    pipes = Array.new(PIPES) { IO.pipe }
    sockets = Array.new(SOCKETS) { UNIXSocket.pair }
    full = Array.new(WRITERS) { IO.pipe }
    timed = Array.new(TIMEOUTS) { IO.pipe }
    queues = Array.new(POPPERS) { Thread::Queue.new }
    got = {pipe: [], socket: [], writer: [], drained: [], sleeper: [], popper: [], timeout: []}
    errors = []
    run = lambda do |kind, i, &body|
      Fiber.schedule do
        got[kind][i] = body.call
      rescue Exception => e # rubocop:disable Lint/RescueException
        errors << "#{kind} #{i}: #{e.class}: #{e.message}"
      end
    end
    evt do
      # Readers into their own small buffers (embedded in the string's heap slot, the kind of memory
      # compaction moves): the first half arrives before compaction, the rest after.
      pipes.each_with_index do |(r, _), i|
        run.call(:pipe, i) do
          buffer = +""
          r.read(16, buffer)
          buffer
        end
      end
      sockets.each_with_index { |(a, _), i| run.call(:socket, i) { a.gets.chomp } }
      full.each_with_index do |(_, w), i|
        loop { break if w.write_nonblock("f" * 65_536, exception: false) == :wait_writable }
        run.call(:writer, i) do
          w.write(format("writer %04d", i))
          w.close
          :written
        end
      end
      SLEEPERS.times { |i| run.call(:sleeper, i) { sleep(0.05 + (i % 10) * 0.01) && i } }
      queues.each_with_index { |queue, i| run.call(:popper, i) { queue.pop } }
      timed.each_with_index do |(r, _), i|
        run.call(:timeout, i) { Timeout.timeout(20, Class.new(StandardError)) { r.read(8) } }
      end

      pipes.each_with_index { |(_, w), i| w.write(format("pipe%04d", i)) }
      # Wait until every reader has taken its first half and waits for the rest: no pipe readable.
      # (A blocking select looks without waiting; IO#nread is gone from Ruby 4.0's io/wait.)
      readers = pipes.map(&:first)
      sleep 0.001 while Fiber.blocking { IO.select(readers, nil, nil, 0) }

      compact

      pipes.each_with_index { |(_, w), i| w.write(format("-%07d", i)) }
      sockets.each_with_index { |(_, b), i| b.write("socket #{i}\n") }
      full.each_with_index do |(r, _), i|
        run.call(:drained, i) { r.read.delete("f") }
      end
      queues.each_with_index { |queue, i| queue << [:item, i] }
      timed.each_with_index { |(_, w), i| w.write(format("t%07d", i)) }
      compact # again, with the second halves landing
    end

    assert_empty errors
    assert_equal Array.new(PIPES) { |i| format("pipe%04d-%07d", i, i) }, got[:pipe]
    assert_equal Array.new(SOCKETS) { |i| "socket #{i}" }, got[:socket]
    assert_equal [:written] * WRITERS, got[:writer]
    assert_equal Array.new(WRITERS) { |i| format("writer %04d", i) }, got[:drained]
    assert_equal Array.new(SLEEPERS) { |i| i }, got[:sleeper]
    assert_equal Array.new(POPPERS) { |i| [:item, i] }, got[:popper]
    assert_equal Array.new(TIMEOUTS) { |i| format("t%07d", i) }, got[:timeout]
  ensure
    [pipes, sockets, full, timed].each { |list| list&.flatten&.each { |io| io.close unless io.closed? } }
  end

  # The heap is compacted by another thread while this one's loop waits in the kernel, the GVL
  # released: the loop's own state on its stack and in C must survive the move as well.
  def test_compaction_from_another_thread_while_the_loop_waits_in_the_kernel
    pipes = Array.new(200) { IO.pipe }
    received = Array.new(pipes.size)
    compacted = Thread::Queue.new
    evt do
      pipes.each_with_index do |(r, _), i|
        Fiber.schedule do
          buffer = +""
          received[i] = r.read(12, buffer) && buffer
        end
      end
      thread = Thread.new do
        compact
        compact
        compacted << true
      end
      compacted.pop # waits in the loop (a cross-thread unblock) while the thread compacts
      thread.join
      pipes.each_with_index { |(_, w), i| w.write(format("data %07d", i)) }
    end
    assert_equal Array.new(pipes.size) { |i| format("data %07d", i) }, received
  ensure
    pipes&.flatten&.each(&:close)
  end
end
