# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's hooks, as ext/evt/hooks.c and the entry points of io.c.

    # ---- hooks ------------------------------------------------------------------------------------

    # Hook: waits until `io` has one of `events`; nil `timeout` means the IO's own #timeout.
    # @param io [IO]
    # @param events [Integer] IO::READABLE, IO::WRITABLE, IO::PRIORITY, or'ed
    # @param timeout [Numeric, nil] seconds
    # @return [Integer, false] the events that are ready, or false when the time ran out
    def io_wait(io, events, timeout)
      get
      io.fileno # IOError for a closed stream, as Ruby raises
      timeout = io.timeout if timeout.nil? && io.is_a?(IO)
      timeout = interval(timeout)
      events &= EVENTS
      ready = ready_now(io, events) # as the C hook: ready IOs do not wait for a turn of the loop
      return ready unless ready.zero?
      return false if timeout&.zero? || events.zero?

      result = wait_io(io, events, timeout)
      result.positive? ? result : false
    end

    # io_read and io_write in this Ruby's convention (INTERFACE), as the C loop binds them at compile time.
    if INTERFACE >= 4
      # Reads into the IO::Buffer at `offset` once, at most `length` bytes; never waits.
      # @return [Integer] bytes read (0: end of file), or -errno (-EAGAIN: nothing ready)
      def io_read(io, buffer, offset, length)
        io_read_single(io, buffer, offset, length)
      end

      # Writes from the IO::Buffer at `offset` once, at most `length` bytes; never waits.
      # @return [Integer] bytes written, or -errno (-EAGAIN: no room)
      def io_write(io, buffer, offset, length)
        io_write_single(io, buffer, offset, length)
      end

      # As io_read, at file position `from` (which does not move).
      def io_pread(io, buffer, from, offset, length)
        io_pread_single(io, buffer, from, offset, length)
      end

      # As io_write, at file position `from` (which does not move).
      def io_pwrite(io, buffer, from, offset, length)
        io_pwrite_single(io, buffer, from, offset, length)
      end
    else
      # Reads into the IO::Buffer at `offset`: at least `length` bytes, end of file or an error
      # (`length` 0: whatever one read gives; -EAGAIN only for read_nonblock, which must not wait).
      # @return [Integer] bytes read, or -errno
      def io_read(io, buffer, length, offset)
        io_read_minimum(io, buffer, length, offset)
      end

      # Writes from the IO::Buffer at `offset`: at least `length` bytes or an error.
      # @return [Integer] bytes written, or -errno
      def io_write(io, buffer, length, offset)
        io_write_minimum(io, buffer, length, offset)
      end

      if RUBY_VERSION >= "4"
        # As io_read, at file position `from` (which does not move); -ESPIPE for a pipe or socket.
        def io_pread(io, buffer, from, length, offset)
          io_pread_minimum(io, buffer, from, length, offset)
        end

        # As io_write, at file position `from` (which does not move).
        def io_pwrite(io, buffer, from, length, offset)
          io_pwrite_minimum(io, buffer, from, length, offset)
        end
      end
    end

    # Hook (IO.select): every IO watched by the loop at once. Bad input raises what IO.select
    # raises.
    # @return [Array<Array>, nil] the ready objects of each array, or nil when the time ran out
    def io_select(readables, writables = nil, exceptables = nil, timeout = nil)
      get
      timeout_ns = interval(timeout)
      result = select_now(readables, writables, exceptables) # validates as IO.select does
      return result if result || timeout_ns&.zero?

      deadline = timeout_ns && (now + timeout_ns)
      watches = [[readables, IO::READABLE], [writables, IO::WRITABLE], [exceptables, IO::PRIORITY]]
      while true # rubocop:disable Style/InfiniteLoop -- the loop's own code leaves no block early (#rescuing)
        waiter = Waiter.new(Fiber.current)
        watches.each { |ios, events| ios&.each { |object| waiter.watch(object.to_io, events) } }
        suspend(waiter, :select, timeout: timeout_ns)
        raise IOError, "stream closed in another thread" if waiter.result == CLOSED

        result = select_now(readables, writables, exceptables)
        return result if result || waiter.result == TIMED_OUT

        timeout_ns = [deadline - now, 0].max if deadline
      end
    end

    # Hook (Kernel#sleep): sleeps `duration` seconds, or until #unblock (nil: no limit); sleep(0)
    # lets the other ready fibers run first.
    # @overload kernel_sleep(duration = nil)
    #   @param duration [Numeric, nil]
    #   @return [nil]
    def kernel_sleep(*arguments)
      raise ArgumentError, "wrong number of arguments (given #{arguments.size}, expected 0..1)" if arguments.size > 1

      timeout = arguments.empty? ? nil : interval(arguments.first)
      get
      if timeout&.zero?
        suspend(Waiter.new(Fiber.current), :yield)
      else
        block_fiber(timeout)
      end
      nil
    end

    # Hook (Mutex, Queue, ConditionVariable...): blocks the current fiber until #unblock (true) or
    # `timeout` seconds (false).
    # @param _blocker [Object] what the fiber waits for (unused)
    # @param timeout [Numeric, nil] seconds; nil: no limit
    # @return [Boolean]
    def block(_blocker, timeout = nil)
      timeout = interval(timeout, saturate: true)
      get
      block_fiber(timeout)
    end

    # Hook: wakes `fiber` from #block or #kernel_sleep. Safe from any thread: another thread's
    # request goes through the queue and the wakeup pipe.
    # @param _blocker [Object] what the fiber waited for (unused)
    # @param fiber [Fiber]
    # @return [nil]
    def unblock(_blocker, fiber)
      check
      if Thread.current == @thread
        waiter = @unblockable[fiber]
        if waiter then wake(waiter, 1)
        elsif fiber == @current && !fiber.nil? && (fiber != @loop_fiber || @running.zero?)
          # Running, not blocked yet: kept for its next block, as a thread's wakeup is kept for its
          # next sleep (early_unblock in loop.h). Any other wait of it drops the unblock. (The loop
          # fiber inside the loop is the loop at work, not running code.)
          @early_unblock = fiber
        end
      else
        # Served by the loop later, and only if it has not resumed the fiber since: else the block
        # this was meant for is over, and a later one must not end. (Looking the waiter up now
        # could miss a fiber on its way into #block, which Ruby code may be preempted in.)
        resumes = (@resumes ||= ObjectSpace::WeakMap.new)
        request(:unblock, fiber, resumes[fiber] || 0)
      end
      nil
    end

    # Hook (Timeout.timeout): raises exception_class.new(*arguments) in the fiber if the block still
    # runs after `duration` seconds. A negative duration has expired already.
    # @yieldparam duration [Numeric, nil]
    # @return [Object] the block's value
    def timeout_after(duration, exception_class, *arguments)
      raise LocalJumpError, "no block given (yield)" unless block_given?

      expired = duration.is_a?(Numeric) && duration.negative?
      timeout = expired ? 0 : interval(duration)
      get
      return yield(duration) if timeout.nil?

      exception = make_exception(exception_class, arguments)
      timer = @timers.add(now + timeout, Timeout.new(Fiber.current, exception))
      begin
        yield(duration)
      ensure
        @timers.remove(timer) # nothing when it fired
      end
    end

    # Hook (Ruby 4.0, IO#close): closes descriptor `fd` (its waiters were interrupted already).
    # @return [Boolean] true when closed, false when it was not open
    def io_close(fd)
      get
      return false if fd.negative?

      # Blocking: on Ruby 4.0 the close would come back here as io_close.
      Fiber.blocking { IO.for_fd(fd, autoclose: true).close }
      true
    rescue Errno::EBADF
      false # in a scheduled fiber, which keeps its own $!
    end

    # What a stand-in for a fiber answers, in the order a missing one is named.
    # @api private
    STAND_IN_METHODS = %i[alive? raise transfer].freeze

    # Hook (Ruby 4.0): raises `exception` in `fiber`, which waits in this loop. From any thread:
    # the loop raises it on its next turn. `fiber` is a Fiber, or, as scheduler interface 5 allows
    # (ruby/ruby#18793), any object that answers alive?, raise and transfer (a wrapper around one).
    # @return [nil]
    # @raise [TypeError] anything else
    def fiber_interrupt(fiber, exception)
      unless fiber.is_a?(Fiber)
        missing = STAND_IN_METHODS.find { |name| !fiber.respond_to?(name) }
        if missing
          raise TypeError, "evt: fiber_interrupt needs a Fiber, or an object that answers alive?, raise and " \
                           "transfer; #{fiber.class} does not answer #{missing}"
        end
      end

      request(:interrupt, fiber, exception)
      nil
    end

    # Runs the loop until no fiber waits in it. Call it from the blocking fiber that drives the
    # scheduler.
    # @return [self]
    # @raise [FiberError] called from a scheduled fiber, or while the loop runs on another fiber
    def run
      get
      current = Fiber.current
      if current != @loop_fiber
        raise FiberError, "evt: the loop is already running on another fiber" if @running.positive?
        unless current.blocking?
          raise FiberError, "evt: the loop runs on a blocking fiber (the one that drives the scheduler), " \
                            "not inside a scheduled fiber"
        end

        @loop_fiber = current
      end
      run_loop(nil)
      self
    end

    # Runs every fiber to completion, then closes the wakeup pipe. Ruby 3.3 and 3.4 keep the
    # exception that ends a thread in $! while this runs, and a `break` or `return` out of a block
    # clears it: the loop's code uses `while` loops only.
    # @return [nil]
    def scheduler_close
      owned
      current = Fiber.current
      if current != @loop_fiber && (@running.positive? || !current.blocking?)
        raise FiberError, "evt: a scheduler is closed from the blocking fiber that drives it, " \
                          "not from inside a scheduled fiber"
      end
      begin
        run
      ensure
        close_pipe
      end
      nil
    end

    # Ends the loop's wait in IO.select, from any thread.
    # @return [nil]
    def wakeup
      check
      signal if @blocked
      nil
    end
  end
end
