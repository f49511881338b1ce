# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's waiters and waits, as ext/evt/waiter.c and wait.c, and its suspension.

    # One suspension of one fiber: what it waits for and how it ended. A new one per suspension,
    # so a stale reference (in the ready queue, a timer, a request) can never wake a later wait.
    # @api private
    class Waiter
      # @return [Fiber] the suspended fiber
      attr_reader :fiber
      # @!attribute [rw] state
      #   @return [Symbol] :idle, :waiting (in the loop's structures) or :ready (in the ready queue)
      # @!attribute [rw] result
      #   @return [Integer] how the wait ended: events (> 0), 1 (unblocked), SPURIOUS, TIMED_OUT or
      #     CLOSED
      # @!attribute [rw] timer
      #   @return [Timers::Timer, nil] its timeout's timer
      # @!attribute [rw] unblockable
      #   @return [Boolean] whether #unblock can end the wait
      # @!attribute [rw] switcher
      #   @return [Boolean] whether it stands for a fiber that switched away (ready_the_switcher)
      attr_accessor :state, :result, :timer, :unblockable, :switcher

      # A waiter for `fiber`, idle, waiting for nothing yet.
      def initialize(fiber)
        @fiber = fiber
        @io = nil # the IO it waits on, and for which events; io_select's IOs go to @watches
        @events = 0
        @watches = nil
        @state = :idle
        @result = SPURIOUS
        @timer = nil
        @unblockable = false
        @switcher = false # made for a fiber that switched away (ready_the_switcher)
      end

      # Adds `io` and the `events` wanted there to what the waiter waits for.
      # @return [void]
      def watch(io, events)
        if @io.nil? && @watches.nil?
          @io = io
          @events = events
        else
          @watches ||= [[@io, @events]]
          @watches << [io, events]
        end
      end

      # @return [Boolean] whether it waits for any IO
      def watching?
        !@io.nil?
      end

      # Yields each IO it watches, with the events it wants there.
      def each_watch
        if @watches then @watches.each { |io, events| yield io, events }
        elsif @io then yield @io, @events
        end
      end
    end

    # A timeout_after in progress: raises `exception` in `fiber` when its timer fires.
    # @api private
    Timeout = Struct.new(:fiber, :exception)

    private

    # ---- waiting ----------------------------------------------------------------------------------

    def wait_io(io, events, timeout)
      deadline = timeout && (now + timeout)
      while true # rubocop:disable Style/InfiniteLoop
        waiter = Waiter.new(Fiber.current)
        waiter.watch(io, events)
        suspend(waiter, :io, timeout: timeout)
        result = waiter.result
        # Made ready, then closed by a fiber that ran first (the close found this one no longer
        # waiting): closed under the wait all the same, as a thread's wait would be.
        raise IOError, "stream closed in another thread" if result == CLOSED || (result.positive? && io.closed?)
        return result unless result == SPURIOUS

        timeout = [deadline - now, 0].max if deadline
      end
    end

    def block_fiber(timeout)
      deadline = timeout && (now + timeout)
      while true # rubocop:disable Style/InfiniteLoop
        waiter = Waiter.new(Fiber.current)
        suspend(waiter, :block, timeout: timeout)
        return true if waiter.result == 1
        return false if waiter.result == TIMED_OUT

        timeout = [deadline - now, 0].max if deadline
      end
    end

    # Suspends the current fiber on `waiter` until the loop resumes it. However the fiber is
    # unwound, the waiter leaves every structure before this returns (see wait_body and wait_ensure
    # in loop.c).
    def suspend(waiter, kind, timeout: nil, target: nil)
      forks = @forks
      waiter.state = :waiting
      @waiting += 1
      unblocked = @early_unblock.equal?(waiter.fiber)
      @early_unblock = nil if unblocked # for this wait if it is a block, else for none
      begin
        waiter.timer = @timers.add(now + timeout, waiter) if timeout
        case kind
        when :io, :select
          waiter.each_watch do |io, events|
            next unless waiter.state == :waiting # ended by one of its IOs already

            if closing?(io)
              wake(waiter, CLOSED)
              next
            end
            list = (@watched[io] ||= {}.compare_by_identity)
            list[waiter] = list.fetch(waiter, 0) | events
          end
          if kind == :select && !waiter.watching? && timeout.nil?
            make_unblockable(waiter) # nothing to watch, no time limit: sleeps until interrupted
          end
        when :block
          make_unblockable(waiter)
          wake(waiter, 1) if unblocked
        when :yield
          wake(waiter, SPURIOUS)
        when :start
          ready_first(waiter)
        end

        if kind == :start
          @current = nil # until the new fiber says it runs
          target.transfer
        elsif waiter.fiber == @loop_fiber
          run_loop(waiter) # the loop fiber waits by running the loop
        else
          @loop_fiber.transfer
        end
      ensure
        if forks == @forks
          unless waiter.state == :idle
            # Resumed by something other than the loop: Fiber#raise or Fiber#kill from another fiber.
            ready_the_switcher(waiter.fiber) if waiter.fiber != @loop_fiber
          end
          detach(waiter)
          waiter.state = :idle
          @waiting -= 1
        end
      end
    end

    def make_unblockable(waiter)
      @unblockable[waiter.fiber] = waiter
      waiter.unblockable = true
    end

    # Takes the waiter out of everything it waits on (a stale ready-queue entry is skipped later).
    def detach(waiter)
      # An IO's list stays while it is empty: the next wait drops it, unless a waiter came back.
      waiter.each_watch { |io, _| @watched[io]&.delete(waiter) }
      @timers.remove(waiter.timer) if waiter.timer
      waiter.timer = nil
      if waiter.unblockable
        @unblockable.delete(waiter.fiber) if @unblockable[waiter.fiber].equal?(waiter)
        waiter.unblockable = false
      end
    end

    def wake(waiter, result)
      return unless waiter.state == :waiting

      detach(waiter)
      waiter.result = result
      waiter.state = :ready
      @ready << waiter
      signal if @blocked # from a trap handler while IO.select waits: it must see the fiber ready
    end

    # The fiber that started a new one: ahead of the others, resumed once that one waits, up to as
    # many starters a turn as it had fibers ready (at least FIRST_MIN), then at the back (as
    # evt_waiter_ready_first in waiter.c; the loop here has no selector's select to keep in order).
    def ready_first(waiter)
      waiter.result = SPURIOUS
      waiter.state = :ready
      if @first_budget.positive?
        @first_budget -= 1
        @first_pending += 1
        @ready.unshift(waiter)
      else
        @ready << waiter
      end
    end

    # A fiber left its wait without the loop resuming it: the fiber that switched to it must wait in
    # the ready queue, or it would never run again (see ready_the_switcher in loop.c).
    def ready_the_switcher(unwound)
      switcher = @current
      @current = unwound
      return if switcher.nil? || switcher == unwound || switcher == @loop_fiber
      return if @unblockable.key?(switcher) || !switcher.alive?

      waiter = Waiter.new(switcher)
      waiter.switcher = true
      waiter.state = :waiting
      @waiting += 1
      wake(waiter, SPURIOUS)
    end
  end
end
