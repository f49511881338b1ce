# frozen_string_literal: true

require "etc"

module Evt
  # Runs blocking operations for {Scheduling#blocking_operation_wait} (Ruby 3.4) on threads of its
  # own. Ruby hands the scheduler a `work` proc for a C function that would otherwise run without
  # the GVL on the loop's thread (zlib, large IO::Buffer copies, big-integer division, file I/O):
  # a worker thread calls it, and it releases the GVL there, so it runs in parallel with the loop,
  # whose other fibers go on. The calling fiber waits on a queue (block/unblock through the loop).
  #
  # The operation's state lives on the calling fiber's stack: the fiber never goes on while a worker
  # may still run it. Interrupted (Timeout, Fiber#raise, kill) before a worker took it, the
  # operation is dropped; while it runs, it is told to stop (Ruby calls its unblock function: zlib
  # and bignum stop early), and the fiber waits for the worker to return before it unwinds.
  #
  # Ruby 3.4 hands a Proc, which a worker calls (it releases the GVL itself); stopping it interrupts
  # the worker thread (Thread#raise), which makes Ruby call the unblock function. Ruby 4.0 hands a
  # Fiber::Scheduler::BlockingOperation, run and cancelled through Ruby's C API
  # ({Evt::BlockingOperation}, ext/evt/blocking.c): its atomic state decides between a worker starting
  # it and the fiber giving it up, and stopping it calls the unblock function from the loop's thread.
  #
  # Completions of short operations are batched while the pool is saturated. A fiber whose
  # operation took less than {SHORT} (likely one step of many: zlib offloads 16 KiB at a time) and
  # ended while at least {#size} other operations wait in the queue would only queue its next step
  # behind them, so waking the loop for it at once (a system call and a thread switch per step) buys
  # nothing: the worker sets it aside, and the whole batch is handed to the loop in one wakeup when
  # the queue runs short, or at the latest {BATCH_DELAY} later (the flusher thread sees to that,
  # whatever the workers are doing). Longer operations, and those their fiber stopped waiting for,
  # are handed back at once: a Timeout around them must not fire in a wait that batching added.
  #
  # Threads start on first use, after a fork too (a child has none), and end with {#close}.
  # @api private
  class BlockingPool
    # Raised in a worker thread to stop the operation of a fiber that no longer waits for it.
    class Cancel < Exception; end # rubocop:disable Lint/InheritException -- not for user rescue

    # One operation: queued, running (on `thread`), stopping (its fiber gave up on it while it ran),
    # cancelled (given up before it ran: never runs) or done.
    Job = Struct.new(:work, :state, :thread, :error, :done)

    # Whether evt's build has the C API for Ruby 4.0's BlockingOperations (ext/evt/blocking.c).
    #
    # @!parse
    #   # Ruby 4.0's Fiber::Scheduler::BlockingOperation run and cancelled through Ruby's C API,
    #   # for the worker pool's threads (ext/evt/blocking.c; defined where Ruby has that API).
    #   # @api private
    #   module ::Evt::BlockingOperation
    #     # @!method self.execute(operation)
    #     #   Runs `operation` on the calling thread, without the GVL.
    #     #   @return [Boolean] true when it ran to its end, false when it was cancelled before it
    #     #     started or while it ran
    #
    #     # @!method self.cancel(operation)
    #     #   From any thread: `operation` will not start if it has not, and is told to stop (its
    #     #   unblock function) if it runs.
    #     #   @return [Boolean] true when it runs, and whoever runs it must still be waited for
    #   end
    NATIVE = defined?(Evt::BlockingOperation) ? true : false
    private_constant :NATIVE

    # Seconds a finished operation's fiber may be kept waiting while the pool is saturated (the
    # default of `batch_delay:`).
    BATCH_DELAY = 0.002
    # Seconds under which an operation's completion may be held at all (the default of
    # `hold_under:`).
    SHORT = 0.001

    # @return [Integer] how many operations may run at once
    attr_reader :size

    # @param size [Integer] how many operations may run at once (threads)
    # @param batch_delay [Numeric] seconds a held completion may wait (see {BATCH_DELAY})
    # @param hold_under [Numeric] seconds under which a completion may be held (see {SHORT})
    def initialize(size, batch_delay: BATCH_DELAY, hold_under: SHORT)
      raise ArgumentError, "evt: pool size must be a positive Integer, not #{size.inspect}" unless size.is_a?(Integer) && size.positive?

      @size = size
      @batch_delay = batch_delay
      @hold_under = hold_under
      @pid = nil
      @jobs = nil
      @threads = []
      @lock = Thread::Mutex.new
      @flush = Thread::ConditionVariable.new
      @held = [] # finished jobs whose fibers are not woken yet
      @held_since = nil
      @submitted = @completed = 0
    end

    # What the pool has done: operations waiting for a thread, running, and done (since it was made).
    # @return [Hash{Symbol => Integer}] :queued, :running, :done
    def stats
      queued = @jobs&.size || 0
      done = @completed
      { queued: queued, running: [@submitted - done - queued, 0].max, done: done }
    end

    # Runs `work` on a worker thread; the current (scheduled) fiber waits.
    # @param work [Proc, Fiber::Scheduler::BlockingOperation] as blocking_operation_wait gets it
    # @return [true] what Ruby expects of the hook (work's own result goes through its state)
    # @raise [Exception] what the operation raised on the worker thread
    def run(work)
      start unless @pid == Process.pid
      job = Job.new(work, :queued, nil, nil, Thread::Queue.new)
      @submitted += 1
      @jobs << job
      done = false
      begin
        job.done.pop
        done = true
      ensure
        # Interrupted (Fiber#kill too, which runs ensure but no rescue): the worker must be done with
        # this fiber's stack before it unwinds.
        cancel(job) unless done
      end
      raise job.error if job.error

      true
    end

    # Ends the worker threads (each finishes the operation it runs).
    # @return [nil]
    def close
      @jobs&.close
      @lock.synchronize { @flush.signal } # the flusher ends once the queue is closed
      @threads.each(&:join) if @pid == Process.pid
      @threads = []
      @jobs = nil
      @pid = nil
      nil
    end

    private

    def start
      @jobs = Thread::Queue.new
      @pid = Process.pid
      @held = [] # a parent's, for fibers that do not run in this process
      @held_since = nil
      jobs = @jobs
      @threads = Array.new(@size) do
        Thread.new do
          Thread.current.name = "evt worker"
          Thread.current.report_on_exception = false
          work_loop(jobs)
        end
      end
      @threads << Thread.new do
        Thread.current.name = "evt flusher"
        Thread.current.report_on_exception = false
        flush_loop(jobs)
      end
    end

    def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # A job is done, after `took` seconds: wake its fiber, with those held so far, unless it was
    # short, still awaited, and the workers have enough queued to go on without the loop (then hold
    # it; the first held wakes the flusher).
    def finished(job, jobs, took)
      ready = @lock.synchronize do
        hold = job.state == :running && took < @hold_under && jobs.size >= @size && !jobs.closed?
        job.state = :done
        @completed += 1
        if hold
          @held << job
          unless @held_since
            @held_since = clock
            @flush.signal
          end
          nil
        else
          take_held << job
        end
      end
      ready&.each { |each_job| each_job.done << true }
    end

    # Called with @lock held.
    def take_held
      held = @held
      @held = []
      @held_since = nil
      held
    end

    # Wakes the fibers of jobs held for the batch delay, when no worker did it before.
    def flush_loop(jobs)
      loop do
        ready = @lock.synchronize do
          if @held_since.nil?
            return if jobs.closed?

            @flush.wait(@lock)
            nil
          elsif (left = @held_since + @batch_delay - clock).positive?
            @flush.wait(@lock, left)
            nil
          else
            take_held
          end
        end
        ready&.each { |job| job.done << true }
      end
    end

    # A Cancel may arrive only while an operation runs; one that comes as it ends is taken before
    # the next, so it can never stop an operation it was not meant for.
    def work_loop(jobs)
      Thread.handle_interrupt(Cancel => :never) do
        while (job = jobs.pop)
          next unless @lock.synchronize { job.state == :queued && (job.state = :running) && (job.thread = Thread.current) }

          started = clock
          begin
            Thread.handle_interrupt(Cancel => :immediate) { perform(job.work) }
          rescue Cancel
            nil
          rescue Exception => e # rubocop:disable Lint/RescueException -- handed to the fiber
            job.error = e
          end
          finished(job, jobs, clock - started)
          flush_cancel
        end
      end
    end

    # Runs one operation here: Ruby 4.0's through the C API, without the GVL; 3.4's Proc by a call.
    def perform(work)
      return work.call if work.is_a?(Proc) || !NATIVE

      BlockingOperation.execute(work)
    end

    def flush_cancel
      Thread.handle_interrupt(Cancel => :immediate) { nil } if Thread.pending_interrupt?(Cancel)
    rescue Cancel
      nil
    end

    # The fiber waiting for `job` was interrupted: drop the operation if no worker has it yet,
    # else stop it and wait until the worker is done with it (and with the fiber's stack). That wait
    # blocks the thread rather than the fiber: a fiber switch would let anything that resumes the
    # fiber unwind it at once (Ruby re-raises Fiber#kill at every switch back into a killed fiber,
    # and a Fiber#raise or timeout may come), with its stack still in the worker's hands. It is
    # short: the operation was told to stop.
    def cancel(job)
      native = NATIVE && !job.work.is_a?(Proc)
      running = @lock.synchronize do
        if job.state == :queued
          job.state = :cancelled
          @completed += 1
          false
        elsif job.state == :running
          job.state = :stopping # its fiber waits for it: not to be held
          # A BlockingOperation is told to stop directly; if it had not started yet (the worker
          # between taking it and running it), it never will.
          native ? BlockingOperation.cancel(job.work) : job.thread.raise(Cancel)
          true
        end
      end
      return unless running

      Thread.handle_interrupt(Object => :never) { Fiber.blocking { job.done.pop } }
    end
  end
end
