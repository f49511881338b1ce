# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's run loop, as ext/evt/loop.c.

    private

    # ---- running ----------------------------------------------------------------------------------

    def switch_to(fiber)
      @current = fiber
      # Counted once another thread has unblocked a fiber here (see #unblock).
      @resumes[fiber] = (@resumes[fiber] || 0) + 1 if @resumes
      fiber.transfer
    ensure
      @current = @loop_fiber
      @early_unblock = nil if @early_unblock.equal?(fiber) # it ended without waiting
    end

    # Raises `exception` in `fiber` from the loop fiber: a switch to it, as #switch_to's, so @current
    # names it until it waits again or ends (when control comes back here). Else its unwinding would
    # take whichever fiber @current named last for the one that switched to it, and ready that one
    # out of its turn (see raise_into in loop.c).
    def raise_into(fiber, exception)
      @current = fiber
      # Its wait is over, as if the loop had resumed it: an unblock meant for that wait must not end
      # a later one (see #unblock).
      @resumes[fiber] = (@resumes[fiber] || 0) + 1 if @resumes
      fiber.raise(exception)
    ensure
      @current = @loop_fiber
    end

    # Raises `exception` through a stand-in for a fiber (fiber_interrupt): its raise switches to the
    # fiber inside, which the loop cannot name. @current is nil meanwhile, so that fiber's unwinding
    # readies no one (see #ready_the_switcher and interrupt_fiber in loop.c).
    def raise_through(stand_in, exception)
      @current = nil
      stand_in.raise(exception)
    ensure
      @current = @loop_fiber
    end

    # Starts `fiber` from the loop fiber through a non-blocking launcher fiber, which makes the first
    # switch into it and hands back a FiberError: CRuby 3.3 and 3.4 leave the thread's count of
    # blocking fibers lowered when a blocking fiber's switch into a new fiber fails (see launch in
    # evt.c). Control comes back when the new fiber waits or ends.
    def launch(fiber)
      @launch_caller = Fiber.current
      @launcher ||= Fiber.new(blocking: false) do
        target = @launch_caller.transfer # made: wait for the first launch
        loop do
          target = begin
            target.transfer # back here, with the next fiber, at the next launch
          rescue FiberError => e
            @launch_error = e
            @launch_caller.transfer
          end
        end
      end.tap(&:transfer)
      @launch_error = nil
      @current = nil # until the new fiber says it runs (starting it can fail)
      @launcher.transfer(fiber)
      error = @launch_error
      @launch_error = nil
      raise error if error
    ensure
      @current = @loop_fiber
      @launch_caller = nil
      @early_unblock = nil if @early_unblock.equal?(fiber) # it ended without waiting
    end

    # Runs a new fiber at once, until it waits or ends.
    def start(fiber)
      get
      current = Fiber.current
      if current == @loop_fiber
        launch(fiber)
      else
        suspend(Waiter.new(current), :start, target: fiber)
      end
      fiber
    end

    # Called by a new scheduled fiber as it begins.
    def started
      check
      @current = Fiber.current
      nil
    end

    # Resumes the fibers that were ready when it started; true when `until_waiter` came up.
    def resume_ready(until_waiter)
      count = @ready.size
      @first_budget = [count, FIRST_MIN].max
      @first_pending = 0
      until @ready.empty?
        if @first_pending.positive? then @first_pending -= 1 # a starter gone first: not one of the count
        elsif count.zero? then break
        else count -= 1
        end
        waiter = @ready.shift
        next unless waiter.state == :ready # left meanwhile (Fiber#raise, kill)

        waiter.state = :idle
        return true if waiter.equal?(until_waiter)

        fiber = waiter.fiber
        if waiter.switcher
          @waiting -= 1
          next unless fiber.alive?
        end
        switch_to(fiber)
      end
      false
    end

    def run_loop(until_waiter)
      @running += 1
      while true # rubocop:disable Style/InfiniteLoop
        take_requests(interrupts: true) unless @requests.empty?
        return if resume_ready(until_waiter)
        return if until_waiter.nil? && @waiting.zero?

        open_backend unless @wakeup_r
        # The kernel first, then the timers: an event that came before a waiter's deadline wakes it
        # as ready, however long the turn's fibers kept the loop from looking.
        first = @timers.first
        # Nothing to wait for while fibers are ready or requests wait (one made by a fiber of this
        # turn, such as a fiber_interrupt, wakes nobody), as poll_timeout in loop.c.
        timeout = if !@ready.empty? || !@requests.empty? then 0
                  elsif first then [first.deadline - now, 0].max
                  end
        wait(timeout)
        fire_timers(now)
      end
    ensure
      @running -= 1
      @current = @loop_fiber
    end

    def fire_timers(time)
      while (timer = @timers.first) && timer.deadline <= time
        target = timer.target
        if target.is_a?(Timeout)
          # Raised in the fiber, wherever it waits; control comes back when it waits again or ends.
          @timers.remove(timer)
          raise_into(target.fiber, target.exception)
        elsif target.state == :waiting
          wake(target, TIMED_OUT) # which takes its timer out
        else
          @timers.remove(timer)
        end
      end
    end

    # Waits in IO.select, without the GVL, for the watched IOs and the wakeup pipe.
    def wait(timeout)
      # Closed behind the loop's back (code that closes every IO it finds): open a new one.
      if @wakeup_r.closed? || @wakeup_w.closed?
        close_pipe
        open_backend
      end
      # Marked closed by now, mostly: Ruby's own checks see them (loop_mark in object.c forgets them so).
      @closing.delete_if { |io, _| io.closed? } unless @closing.empty?
      readers = [@wakeup_r]
      writers = []
      priority = []
      closed = nil
      @watched.delete_if do |io, list|
        next true if list.empty? # nobody waits on it any more: the IO may be collected
        if io.closed? # closed without passing through CloseWatch (or by another thread, just now)
          (closed ||= []) << io
          next false
        end
        events = 0
        list.each_value { |wanted| events |= wanted }
        readers << io if events.anybits?(IO::READABLE)
        writers << io if events.anybits?(IO::WRITABLE)
        priority << io if events.anybits?(IO::PRIORITY)
        false
      end
      closed&.each { |io| close_io(io, elsewhere: false) }
      return unless closed.nil? # their fibers are ready now

      @blocked = true
      # Blocking: in a forked child the loop fiber may be a scheduled one, whose IO.select is ours.
      result = rescuing(IOError, Errno::EBADF) do
        Fiber.blocking { IO.select(readers, writers, priority, timeout && (timeout / 1e9)) }
      end
      @blocked = false
      if result.is_a?(Exception)
        # An IO closed meanwhile by another thread (its request comes next), or a descriptor
        # closed under its IO object.
        result = nil
        wake_bad_descriptors
      end
      # IOs closed by other threads meanwhile: their waiters learn it before any event for them.
      take_requests(interrupts: false) unless @requests.empty?
      dispatch(result) if result
    end

    def dispatch(result)
      readable, writable, priority = result
      readable.each do |io|
        if io.equal?(@wakeup_r) then Fiber.blocking { @wakeup_r.read_nonblock(4096, exception: false) }
        else io_ready(io, IO::READABLE)
        end
      end
      writable.each { |io| io_ready(io, IO::WRITABLE) }
      priority.each { |io| io_ready(io, IO::PRIORITY) }
    end

    # Wakes the waiters on `io` that want some of `events` (a waiter already woken for the other
    # direction of the same IO gets these too). Waking takes a waiter out of the list as it goes,
    # which Hash#each allows.
    def io_ready(io, events)
      @watched[io]&.each do |waiter, wanted|
        hit = wanted & events
        next if hit.zero?

        if waiter.state == :ready && waiter.result.positive? then waiter.result |= hit
        else wake(waiter, hit)
        end
      end
    end

    # Waiters on a descriptor closed under its IO object (IO.for_fd's twin closed it): woken as
    # ready, so their retry meets EBADF, as poll(2)'s POLLNVAL does in the C backends. An IO another
    # thread closes meanwhile (IOError from the look) is left to that close, which wakes its waiters.
    def wake_bad_descriptors
      @watched.keys.each do |io|
        next if io.closed? || !rescuing(Errno::EBADF, IOError) { select_now([io], nil, nil) }.is_a?(Errno::EBADF)

        @watched[io]&.dup&.each { |waiter, wanted| wake(waiter, wanted) }
      end
    end
  end
end
