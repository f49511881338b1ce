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
  # operation is dropped; while it runs, the worker thread is interrupted (Thread#raise), which
  # makes Ruby call the operation's unblock function (zlib and bignum stop early), and the fiber
  # waits for the worker to return before it unwinds.
  #
  # Threads start on first use, after a fork too (a child has none), and end with {#close}.
  class WorkerPool
    # Raised in a worker thread to stop the operation of a fiber that no longer waits for it.
    class Cancel < Exception; end # rubocop:disable Lint/InheritException -- not for user rescue

    # One operation: queued, running (on +thread+), or done.
    Job = Struct.new(:work, :state, :thread, :error, :done)

    attr_reader :size

    # @param size [Integer] how many operations may run at once (threads)
    def initialize(size)
      raise ArgumentError, "evt: pool size must be a positive Integer, not #{size.inspect}" unless size.is_a?(Integer) && size.positive?

      @size = size
      @pid = nil
      @jobs = nil
      @threads = []
      @lock = Thread::Mutex.new
    end

    # Runs +work+ on a worker thread; the current (scheduled) fiber waits. Returns what Ruby
    # expects of the hook (work's own result goes through its state).
    def run(work)
      start unless @pid == Process.pid
      job = Job.new(work, :queued, nil, nil, Thread::Queue.new)
      @jobs << job
      begin
        job.done.pop
      rescue Exception # rubocop:disable Lint/RescueException -- any interruption cancels, then goes on
        cancel(job)
        raise
      end
      raise job.error if job.error

      true
    end

    # Ends the worker threads (each finishes the operation it runs).
    def close
      @jobs&.close
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
      jobs = @jobs
      @threads = Array.new(@size) do
        Thread.new do
          Thread.current.name = "evt worker"
          Thread.current.report_on_exception = false
          work_loop(jobs)
        end
      end
    end

    # A Cancel may arrive only while an operation runs; one that comes as it ends is taken before
    # the next, so it can never stop an operation it was not meant for.
    def work_loop(jobs)
      Thread.handle_interrupt(Cancel => :never) do
        while (job = jobs.pop)
          next unless @lock.synchronize { job.state == :queued && (job.state = :running) && (job.thread = Thread.current) }

          begin
            Thread.handle_interrupt(Cancel => :immediate) { job.work.call }
          rescue Cancel
            nil
          rescue Exception => e # rubocop:disable Lint/RescueException -- handed to the fiber
            job.error = e
          end
          @lock.synchronize { job.state = :done }
          job.done << true
          flush_cancel
        end
      end
    end

    def flush_cancel
      Thread.handle_interrupt(Cancel => :immediate) { nil } if Thread.pending_interrupt?(Cancel)
    rescue Cancel
      nil
    end

    # The fiber waiting for +job+ was interrupted: drop the operation if no worker has it yet,
    # else stop it and wait until the worker is done with it (and with the fiber's stack).
    def cancel(job)
      running = @lock.synchronize do
        if job.state == :queued
          job.state = :cancelled
          false
        elsif job.state == :running
          job.thread.raise(Cancel)
          true
        end
      end
      return unless running

      finished = false
      until finished
        begin
          job.done.pop
          finished = true
        rescue Exception # rubocop:disable Lint/RescueException -- the worker still has the stack
          nil
        end
      end
    end
  end
end
