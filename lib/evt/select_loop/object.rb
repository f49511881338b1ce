# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's object: making it, fork, its pipe, as ext/evt/object.c.

    # Process._fork, which every fork of Ruby goes through (Process.daemon aside): the child counts it.
    # @api private
    module ForkWatch
      # Process._fork, counted in the child.
      # @return [Integer] the child's pid in the parent, 0 in the child
      def _fork
        pid = super
        SelectLoop.forked if pid.zero?
        pid
      end

      # Forks in C, without _fork; returns in the child only.
      # @return [0]
      def daemon(...)
        result = super(...)
        SelectLoop.forked
        result
      end
    end
    Process.singleton_class.prepend(ForkWatch)

    # A loop for the current thread, with its wakeup pipe open.
    # @param name [Symbol, String] :select
    # @raise [ArgumentError] any other name
    # @raise [TypeError] `name` is not a Symbol or String
    def initialize(name)
      raise "evt: loop already initialized" if @backend

      name = SelectLoop.__send__(:backend_name, name)
      raise ArgumentError, "evt: unknown backend #{name.inspect}" unless BACKENDS.include?(name)

      @backend = name
      @loop_fiber = @current = Fiber.current
      @thread = Thread.current
      @forks = SelectLoop.forks
      @ready = []
      @first_budget = FIRST_MIN
      @first_pending = 0
      @timers = Timers.new
      @watched = {}.compare_by_identity # io => {waiter => events}
      @closing = {}.compare_by_identity # io => true: another thread closes it (see #close_io)
      @blocking_modes = ObjectSpace::WeakMap.new # io => whether its descriptor is in blocking mode
      @resumes = nil # fiber => how often the loop resumed it, once another thread unblocks
      @unblockable = {}.compare_by_identity # fiber => waiter
      @early_unblock = nil # an unblock for the fiber running now, before it blocked (see #unblock)
      @requests = Thread::Queue.new # from other threads: [kind, subject, argument]
      @waiting = 0
      @running = 0
      @blocked = false
      @wakeup_r = @wakeup_w = nil
      SelectLoop.watch_closes
      SelectLoop.loops[self] = true
      open_backend
    end

    # @return [Symbol] :select
    def backend
      check
      @backend
    end

    # @return [Boolean] whether the wakeup pipe is closed (a later use opens it again)
    def closed?
      check
      @wakeup_r.nil?
    end

    # @return [Integer] the number of fibers suspended in the loop
    def waiting
      check
      @waiting
    end

    private

    # ---- the loop object --------------------------------------------------------------------------

    # The loop, after any fork. Only the child's main thread (the one that forked) starts it over:
    # a thread started in the child may call #unblock before that thread used the loop again.
    def check
      raise "evt: the scheduler is not initialized" unless @backend

      after_fork if @forks != SelectLoop.forks && Thread.current == Thread.main
      self
    end

    # The loop, for its own thread: an idle one moves to the thread that uses it next.
    def owned
      check
      thread = Thread.current
      if thread != @thread
        if @waiting.positive? || @running.positive?
          raise ThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it"
        end

        @thread = thread
        @loop_fiber = @current = Fiber.current
        @launcher = nil # a fiber belongs to its thread
      end
      self
    end

    # The loop, ready for its thread: a closed one opens again.
    def get
      owned
      open_backend unless @wakeup_r
      self
    end

    def open_backend
      @wakeup_r, @wakeup_w = IO.pipe
    end

    def close_pipe
      @wakeup_r&.close unless @wakeup_r&.closed?
      @wakeup_w&.close unless @wakeup_w&.closed?
      @wakeup_r = @wakeup_w = nil
    end

    def close_backend
      owned
      raise FiberError, "evt: the loop is running: it closes when it is done" if @running.positive?

      close_pipe
      nil
    end

    # In a forked child: the pipe is the parent's, and so are the fibers waiting here; the forking
    # fiber now drives the loop (see loop_after_fork in object.c). Requests stay: those the parent's
    # threads made are dropped when served, those of the child's threads are the child's.
    def after_fork
      @forks = SelectLoop.forks
      # Dropped, not closed: Ruby 3.4's IO#close in a child can wait for users of the descriptor
      # the child inherited from its parent's threads (seen here with the worker pool's threads
      # starting before the loop did), and the GC's finalizer closes it without waiting.
      @wakeup_r = @wakeup_w = nil
      @ready = []
      @first_budget = FIRST_MIN
      @first_pending = 0
      @timers.clear
      @watched.clear
      @closing.clear
      @unblockable.clear
      @early_unblock = nil
      @waiting = 0
      @running = 0
      @blocked = false
      @loop_fiber = @current = Fiber.current
      @thread = Thread.current
      @launcher = nil # another thread's perhaps, which the child has not
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    end

    # nil -> nil (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives.
    # Past Time's range (2**63 seconds), `saturate` gives FOREVER (Queue#pop(timeout:) waits any
    # time without a scheduler), else RangeError (as sleep and IO.select raise).
    def interval(value, saturate: false)
      return nil if value.nil?
      raise TypeError, "can't convert #{value.class} into time interval" unless value.is_a?(Numeric)
      raise ArgumentError, "time interval must not be negative" if value.negative?

      if value >= 2**63 || (value.is_a?(Float) && value.nan?)
        return FOREVER if saturate

        raise RangeError, "#{value.is_a?(Float) ? format("%f", value) : value} out of Time range"
      end
      [(value * 1_000_000_000).to_i, FOREVER].min
    end

    def make_exception(exception_class, arguments)
      unless exception_class.respond_to?(:exception)
        raise TypeError, "exception class/object expected" unless exception_class.is_a?(String) && arguments.empty?

        return RuntimeError.new(exception_class)
      end
      exception = exception_class.exception(*arguments)
      raise TypeError, "exception object expected" unless exception.is_a?(Exception)

      exception
    end

    # The block's value, or the exception of `classes` it raised. On Ruby 3.3 and 3.4, $! holds the
    # exception that is ending the thread while scheduler_close runs, and a rescue (like a `break`
    # out of a block) on this fiber would clear it; then the rescue happens on a fiber of its own.
    def rescuing(*classes)
      unless $!
        begin
          return yield
        rescue *classes => e
          return e
        end
      end
      Fiber.new(blocking: true) do
        yield
      rescue *classes => e
        e
      end.resume
    end
  end
end
