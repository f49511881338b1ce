# frozen_string_literal: true

require "rbconfig"
%w[io/nonblock fcntl].each do |name| # fcntl now: loaded in IO#close_read, it would read through the scheduler
  require name
rescue LoadError
  nil # no IO#nonblock?: every descriptor counts as non-blocking
end

module Evt
  # The pure-Ruby loop, over IO.select: evt where the C extension cannot load, and {SelectScheduler}.
  # A fallback with Ruby's semantics, not a copy of the C core: each hook gives the results and
  # errors it gives there, but a turn's order, fairness and batching are the C core's alone (the
  # README says what this loop does not promise). A suspended fiber leaves a waiter in the ready
  # queue, on the IOs it watches, on a timer, or where #unblock finds it.
  class SelectLoop
    # This Ruby's scheduler interface (RUBY_FIBER_SCHEDULER_VERSION), read from its header.
    # @api private
    INTERFACE = begin
      header = File.join(RbConfig::CONFIG["rubyhdrdir"], "ruby", "fiber", "scheduler.h")
      Integer(File.read(header)[/^#define RUBY_FIBER_SCHEDULER_VERSION (\d+)/, 1])
    rescue StandardError
      RUBY_VERSION >= "4.1" ? 4 : 3
    end
    EVENTS = IO::READABLE | IO::PRIORITY | IO::WRITABLE # what io_wait knows; others are dropped
    FOREVER = 2**61 # the longest timeout, in ns (73 years)
    # One suspension of one fiber. `state`: :waiting, :ready or :done; `result`: the events that came,
    # :unblocked, :timed_out, :closed or nil; `switcher`: made for a fiber that switched away; `what`:
    # [kind, subject] as Evt::Loop#waits shows it; `since`: when it began, to the turn.
    Waiter = Struct.new(:fiber, :state, :result, :watches, :timer, :switcher, :what, :since)
    Timeout = Struct.new(:fiber, :exception) # a timeout_after in progress
    # Fires `target` (a Waiter or a Timeout) at `deadline` (monotonic ns); @timers is sorted by
    # deadline, then by `sequence`.
    Timer = Struct.new(:deadline, :sequence, :target)
    private_constant :EVENTS, :FOREVER, :Waiter, :Timeout, :Timer

    @forks = 0

    class << self
      # (see Evt::Loop.backends)
      def backends = [:select]
      # (see Evt::Loop.probe)
      def probe(name) = backend_name(name) == :select ? nil : "unknown backend"
      # (see Evt::Loop.emulation)
      def emulation(name) = backend_name(name) && nil

      # @api private
      # @return [Symbol]
      def backend_name(name)
        return name.to_sym if name.is_a?(Symbol) || name.is_a?(String)

        raise TypeError, "evt: backend name must be a Symbol or String, not #{name.class}"
      end

      # @api private
      # @return [Integer] forks this process is down from the first ({ForkWatch} counts them)
      attr_accessor :forks

      # @api private
      # @return [ObjectSpace::WeakMap] this Ractor's select loops (loop => true), for IO#close
      def loops = Ractor.current[:evt_select_loops] ||= ObjectSpace::WeakMap.new
    end

    # Prepended to Process: a child counts the fork (Process._fork is every fork but daemon's).
    # @api private
    module ForkWatch
      # @return [Integer] the child's pid in the parent, 0 in the child
      def _fork = super.tap { |pid| SelectLoop.forks += 1 if pid.zero? }
      # @return [0] in the child: the parent has exited
      def daemon(...) = super.tap { SelectLoop.forks += 1 }
    end
    Process.singleton_class.prepend(ForkWatch)

    # (see Evt::Loop#initialize)
    def initialize(backend)
      raise "evt: loop already initialized" if @backend

      backend = SelectLoop.backend_name(backend)
      raise ArgumentError, "evt: unknown backend #{backend.inspect}" unless backend == :select

      @backend = backend
      @blocking_modes = ObjectSpace::WeakMap.new # io => whether its descriptor is in blocking mode
      @requests = Thread::Queue.new # from other threads: [kind, subject, argument, forks]
      @resumes = nil # fiber => how often the loop resumed it, once an unblock or interrupt came (#unblock)
      @forks = SelectLoop.forks
      reset
      SelectLoop.loops[self] = true
      @wakeup_r, @wakeup_w = IO.pipe
    end

    # (see Evt::Loop#backend)
    def backend = check && @backend
    # (see Evt::Loop#closed?)
    def closed? = check && @wakeup_r.nil?
    # (see Evt::Loop#waiting)
    def waiting = check && @waiting

    private

    # No fiber waits: a new loop, or a forked child's (the parent's fibers do not go on there).
    def reset
      @ready = []
      @timers = []
      @sequence = @first = @waiting = @running = 0 # @first: starters put in front this turn
      @watched = {}.compare_by_identity # io => {waiter => events}
      @unblockable = {}.compare_by_identity # fiber => waiter
      @early_unblock = nil # an unblock for the fiber running now, before it blocked (#unblock)
      @blocked = false # in IO.select
      @loop_fiber = @current = Fiber.current
      @thread = Thread.current
      @launcher = nil
      insight_reset
    end

    # The loop, after any fork: the forking thread starts it over (only that one: a thread of the
    # child may unblock before).
    def check
      raise "evt: the scheduler is not initialized" unless @backend

      if @forks != SelectLoop.forks && Thread.current == Thread.main
        @forks = SelectLoop.forks
        @wakeup_r = @wakeup_w = nil # dropped, not closed: Ruby 3.4's close could wait for the parent's threads
        reset
      end
      self
    end

    # The loop, for its own thread, with its pipe: an idle one moves to the thread that uses it.
    def get
      check
      if Thread.current != @thread
        raise ThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it" if @waiting + @running > 0

        @thread = Thread.current
        @loop_fiber = @current = Fiber.current
        @launcher = nil
      end
      @wakeup_r, @wakeup_w = IO.pipe unless @wakeup_r
      self
    end

    def close_pipe
      [@wakeup_r, @wakeup_w].each { |io| io.close unless io.nil? || io.closed? }
      @wakeup_r = @wakeup_w = nil
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

    def add_timer(deadline, target)
      timer = Timer.new(deadline, @sequence += 1, target)
      @timers.insert(@timers.bsearch_index { |t| t.deadline > deadline } || @timers.size, timer)
      timer
    end

    def remove_timer(timer)
      at = @timers.bsearch_index { |t| t.deadline > timer.deadline || (t.deadline == timer.deadline && t.sequence >= timer.sequence) }
      @timers.delete_at(at) if at && @timers[at].equal?(timer)
    end

    # nil -> nil (no limit); otherwise nanoseconds, with Kernel#sleep's errors. Past Time's range,
    # `saturate` gives FOREVER (Queue#pop(timeout:) waits any time), else RangeError.
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

    # A duration Ruby hands on unchecked (Queue#pop(timeout:), Timeout.timeout): a negative one has
    # expired, NaN and one past Time's range never end, as Ruby without a scheduler takes them.
    def unchecked_interval(value)
      value.is_a?(Numeric) && value.negative? ? 0 : interval(value, saturate: true)
    end

    # The block's value, or its exception of `classes`. While scheduler_close runs, $! holds the
    # exception ending the thread, which a rescue here would clear (Thread#join would not raise it):
    # then the rescue happens on a fiber of its own. (So the loop never breaks out of a block.)
    def rescuing(*classes, &block)
      return Fiber.new(blocking: true) { rescuing(*classes, &block) }.resume if $!

      yield
    rescue *classes => e
      e
    end

    # ---- waiting -------------------------------------------------------------------------------

    # Suspends the current fiber until the loop resumes it; returns how the wait ended. It waits
    # for its `watches`, `timeout` ns, an unblock (`unblockable`); `ready` puts it in the ready
    # queue at once (`first`: in front). Control goes to the loop fiber, or to the new fiber `to`.
    # However the fiber leaves, its waiter leaves every structure.
    def suspend(timeout: nil, watches: nil, unblockable: false, ready: false, first: false, to: nil, what: nil) # rubocop:disable Metrics/ParameterLists
      waiter = Waiter.new(Fiber.current, :waiting, nil, watches, nil, nil, what || [to ? :start : :yield, to], @clock)
      forks = @forks
      @waiting += 1
      early = @early_unblock.equal?(waiter.fiber)
      @early_unblock = nil if early # for this wait if it is a block, else for none
      begin
        waiter.timer = add_timer(now + timeout, waiter) if timeout
        watches&.each do |io, events|
          list = (@watched[io] ||= {}.compare_by_identity)
          list[waiter] = list.fetch(waiter, 0) | events
        end
        @unblockable[waiter.fiber] = waiter if unblockable
        wake(waiter, :unblocked) if unblockable && early
        if first
          waiter.state = :ready
          @ready.unshift(waiter)
          @first += 1
        end
        wake(waiter, nil) if ready
        if to
          @current = nil # until the new fiber says it runs
          to.transfer
        elsif waiter.fiber.equal?(@loop_fiber) then run_loop(waiter) # the loop fiber waits by running it
        else @loop_fiber.transfer
        end
      ensure
        leave(waiter) if forks == @forks # (a child's waits are the parent's)
      end
      waiter.result
    end

    def leave(waiter)
      # Not resumed by the loop: Fiber#raise or Fiber#kill from another fiber.
      ready_the_switcher(waiter.fiber) unless waiter.state == :done || waiter.fiber.equal?(@loop_fiber)
      detach(waiter)
      waiter.state = :done
      @waiting -= 1
    end

    # Takes the waiter out of what it waits on. An IO's list stays while empty: the next turn drops it.
    def detach(waiter)
      waiter.watches&.each { |io, _| @watched[io]&.delete(waiter) }
      remove_timer(waiter.timer) if waiter.timer
      waiter.timer = nil
      @unblockable.delete(waiter.fiber) if @unblockable[waiter.fiber].equal?(waiter)
    end

    def wake(waiter, result)
      return unless waiter.state == :waiting

      detach(waiter)
      waiter.result = result
      waiter.state = :ready
      @ready << waiter
      signal if @blocked # from a trap handler during IO.select: it must see the fiber ready
    end

    # A fiber left its wait without the loop resuming it: the fiber that switched to it is in no
    # wait, and must go in the ready queue or it would never run again.
    def ready_the_switcher(unwound)
      switcher = @current
      @current = unwound
      return if switcher.nil? || switcher == unwound || switcher == @loop_fiber
      return if @unblockable.key?(switcher) || !switcher.alive?

      @waiting += 1
      @ready << Waiter.new(switcher, :ready, nil, nil, nil, true)
    end

    # The block's first value that is not nil, given what is left of `timeout` ns each time: a wait
    # ended for nothing (a yield, a readiness that was gone) waits again for the rest.
    def until_done(timeout)
      deadline = timeout && (now + timeout)
      while (result = yield(timeout)).nil?
        timeout = [deadline - now, 0].max if deadline
      end
      result
    end

    def wait_io(io, events, timeout)
      until_done(timeout) do |left|
        result = suspend(timeout: left, watches: [[io, events]], what: [:io, io])
        # Made ready, then closed by a fiber that ran first: closed under the wait all the same.
        raise IOError, "stream closed in another thread" if result == :closed || (result.is_a?(Integer) && io.closed?)

        result
      end
    end

    def block_fiber(timeout, blocker = nil)
      what = [blocker ? :block : :sleep, blocker]
      until_done(timeout) { |left| { unblocked: true, timed_out: false }[suspend(timeout: left, unblockable: true, what: what)] }
    end

    # ---- running -------------------------------------------------------------------------------

    def start(fiber)
      get
      Fiber.current.equal?(@loop_fiber) ? launch(fiber) : suspend(first: true, to: fiber)
      fiber
    end

    def started
      check
      @current = Fiber.current
      nil
    end

    # Starts `fiber` from the loop fiber through a non-blocking launcher fiber, which hands back a
    # FiberError: CRuby 3.3 and 3.4 leave the thread's count of blocking fibers lowered when a
    # blocking fiber's switch into a new fiber fails.
    def launch(fiber)
      @launch_caller = Fiber.current
      @launcher ||= Fiber.new(blocking: false) do
        target = @launch_caller.transfer
        while true # rubocop:disable Style/InfiniteLoop
          target = begin
            target.transfer # back here, with the next fiber, at the next launch
          rescue FiberError => e
            @launch_error = e
            @launch_caller.transfer
          end
        end
      end.tap(&:transfer)
      @current = nil # until the new fiber says it runs
      beat(@loop_fiber) if @stall
      @launcher.transfer(fiber)
      beat(@current || fiber) if @stall
      error, @launch_error = @launch_error, nil
      raise error if error
    ensure
      @current = @loop_fiber
      @early_unblock = nil if @early_unblock.equal?(fiber) # it ended without waiting
    end

    # Runs `fiber` (or raises `exception` in it) until it waits or ends.
    def switch_to(fiber, exception = nil)
      beat(@loop_fiber) if @stall
      @current = fiber
      @resumes[fiber] = (@resumes[fiber] || 0) + 1 if @resumes
      exception ? fiber.raise(exception) : fiber.transfer
    ensure
      beat(@current || fiber) if @stall
      @current = @loop_fiber
      @early_unblock = nil if @early_unblock.equal?(fiber)
    end

    # The fibers ready when the turn began, and the starters put in front meanwhile (a fiber that
    # started another goes on as soon as that one waits, as in Ruby's reference scheduler). true
    # when `until_waiter` came up.
    def resume_ready(until_waiter)
      count = @ready.size
      @first = 0
      while (@first.positive? || count.positive?) && (waiter = @ready.shift)
        @first.positive? ? @first -= 1 : count -= 1
        next unless waiter.state == :ready # left meanwhile (Fiber#raise, kill)

        waiter.state = :done
        return true if waiter.equal?(until_waiter)

        @waiting -= 1 if waiter.switcher
        switch_to(waiter.fiber) if waiter.fiber.alive?
      end
      false
    end

    # Turns: the other threads' requests, the ready fibers, IO.select, the due timers.
    def run_loop(until_waiter)
      @running += 1
      while true # rubocop:disable Style/InfiniteLoop
        serve_requests(interrupts: true) unless @requests.empty?
        @ready_max = @ready.size if @ready.size > @ready_max
        return if resume_ready(until_waiter) || (until_waiter.nil? && @waiting.zero?)

        @turns += 1
        @clock = now
        first = @timers.first
        wait(if !@ready.empty? || !@requests.empty? then 0
             elsif first then [first.deadline - now, 0].max
             end)
        time = now
        while (timer = @timers.first) && timer.deadline <= time
          @timers.shift
          count_late(time - timer.deadline)
          next switch_to(timer.target.fiber, timer.target.exception) if timer.target.is_a?(Timeout)

          timer.target.timer = nil
          wake(timer.target, :timed_out)
        end
      end
    ensure
      @running -= 1
      @current = @loop_fiber
    end

    # IO.select (without the GVL) on the watched IOs and the wakeup pipe; wakes the ready waiters.
    def wait(timeout)
      close_pipe if @wakeup_r&.closed? || @wakeup_w&.closed? # closed behind the loop's back
      @wakeup_r, @wakeup_w = IO.pipe unless @wakeup_r
      sets = [[@wakeup_r], [], []]
      closed = []
      @watched.delete_if do |io, list|
        next true if list.empty? # nobody waits on it any more: the IO may be collected
        next false if io.closed? && closed << io # closed without passing through CloseWatch

        events = list.each_value.reduce(0, :|)
        [IO::READABLE, IO::WRITABLE, IO::PRIORITY].each_with_index { |event, i| sets[i] << io if events.anybits?(event) }
        false
      end
      closed.each { |io| close_io(io) }
      return unless closed.empty? # their fibers are ready now

      @blocked = true
      @kernel_waits += 1
      beat(@loop_fiber) if @stall
      started = @clock = now # (stats counts a wait under way from here)
      # Blocking: in a forked child the loop fiber may be a scheduled one, whose IO.select is ours.
      result = rescuing(IOError, Errno::EBADF) { Fiber.blocking { IO.select(*sets, timeout && (timeout / 1e9)) } }
      @clock = now
      @kernel_ns += @clock - started unless timeout&.zero?
      beat(nil) if @stall
      @blocked = false
      wake_bad_descriptors if result.is_a?(Exception)
      serve_requests(interrupts: false) unless @requests.empty? # closes: before any event on those IOs
      return unless result.is_a?(Array)

      result.zip([IO::READABLE, IO::WRITABLE, IO::PRIORITY]) do |ios, events|
        ios.each do |io|
          next Fiber.blocking { io.read_nonblock(4096, exception: false) } if io.equal?(@wakeup_r)

          @events += 1
          @watched[io]&.each do |waiter, wanted|
            next if (hit = wanted & events).zero?

            if waiter.state == :ready && waiter.result.is_a?(Integer) then waiter.result |= hit
            else wake(waiter, hit)
            end
          end
        end
      end
    end

    # Waiters on a descriptor closed under its IO (by IO.for_fd's twin) wake, to meet EBADF.
    def wake_bad_descriptors
      @watched.each do |io, list|
        next if io.closed? || !rescuing(Errno::EBADF, IOError) { select_now([io], nil, nil) }.is_a?(Errno::EBADF)

        list.to_a.each { |waiter, wanted| wake(waiter, wanted) }
      end
    end

    # ---- other threads ---------------------------------------------------------------------------

    def signal
      @wakeup_w.write_nonblock(".", exception: false) if @forks == SelectLoop.forks && @wakeup_w && !@wakeup_w.closed?
    end

    def request(kind, subject, argument = nil)
      @requests << [kind, subject, argument, SelectLoop.forks]
      signal if Thread.current != @thread # always: the loop may be on its way into IO.select
    end

    # The other threads' requests, in the order they came; fiber interrupts only when `interrupts`
    # (not while IO.select's result waits to be dispatched).
    def serve_requests(interrupts:)
      requests = []
      requests << @requests.pop(true) until @requests.empty?
      @requests_served += requests.size
      own = nil
      until requests.empty?
        kind, subject, argument, forks = item = requests.shift
        next if forks != @forks # made in the parent, before the fork

        case kind
        when :closed then close_io(subject)
        when :unblock
          waiter = @unblockable[subject]
          wake(waiter, :unblocked) if waiter && (@resumes[subject] || 0) == argument
        when :interrupt
          exception, resumed, ios, closing = argument
          if !interrupts then @requests << item
          elsif subject.equal?(Fiber.current) then own = exception
          elsif !outdated?(subject, resumed, ios, closing) then interrupt(subject, exception)
          end
        end
      end
      raise own if own
    ensure
      requests.each { |rest| @requests << rest } # a stand-in's raise raised: the rest wait
    end

    # Whether an interrupt of a Fiber is for a wait that is over. From an IO#close (`closing`: the IOs it
    # closes, CloseWatch says which), it is for a wait on them: the fiber's wait now, or the one an
    # event has ended and it has not left yet (the close raises there, as for a thread). Otherwise,
    # `ios` being what it waited on when the interrupt came, one that came before the loop resumed
    # the fiber once more may be for a wait an event had ended: it stands if the fiber waits on the
    # same IO again, which Ruby's IO#close may still wait for it to leave (the closer's flush let it
    # run before the IO was marked closed).
    def outdated?(fiber, resumed, ios, closing)
      return false unless resumed # a stand-in's: always raised
      return !waits_on?(fiber, closing) if closing
      return false if (@resumes[fiber] || 0) == resumed

      !waits_on?(fiber, ios)
    end

    def waits_on?(fiber, ios)
      ios.any? { |io| @watched[io]&.each_key&.any? { |waiter| waiter.fiber.equal?(fiber) } } ||
        @ready.any? do |waiter|
          waiter.fiber.equal?(fiber) && waiter.state == :ready && waiter.watches&.any? { |io, _| ios.include?(io) }
        end
    end

    # The IOs `fiber` waits on, or was made ready from and has not run since. From any thread: it
    # reads copies, made in one call each, of what the loop's thread may change meanwhile.
    def waited_ios(fiber)
      waiter = @ready.dup.find { |candidate| candidate.fiber.equal?(fiber) && candidate.state == :ready } ||
               @watched.values.lazy.flat_map(&:keys).find { |candidate| candidate.fiber.equal?(fiber) }
      (waiter&.watches || []).map(&:first)
    end

    # Raises `exception` in `fiber`, or through a stand-in for one (whose raise switches to a fiber
    # the loop cannot name: @current is nil meanwhile, so its unwinding readies no one).
    def interrupt(fiber, exception)
      return unless fiber.alive?
      return switch_to(fiber, exception) if fiber.is_a?(Fiber)

      begin
        @current = nil
        fiber.raise(exception)
      ensure
        @current = @loop_fiber
      end
    rescue FiberError
      nil # not suspended any more: nothing to interrupt
    end

    # Whether a fiber waits on `io`, or did until the last turn: another thread closing it tells
    # the loop even when none waits right now, as one may be about to. From any thread.
    def knows?(io) = @forks == SelectLoop.forks && @watched.key?(io)
    def owned_here? = Thread.current == @thread
    def can_yield? = Fiber.current == @loop_fiber || (@running.positive? && Fiber.current == @current)
    def io_closing(io) = owned_here? ? close_io(io) : request(:closed, io)

    # Wakes the waiters on `io` with :closed. (A fiber that begins to wait while another thread's
    # close goes on is woken when the close is over: SelectLoop.closed.)
    def close_io(io) = @watched[io]&.keys&.each { |waiter| wake(waiter, :closed) }

    def suspended_fibers
      check
      fibers = @ready.select { |waiter| waiter.state == :ready }.map(&:fiber)
      @timers.each { |timer| fibers << timer.target.fiber if timer.target.is_a?(Waiter) }
      @watched.each_value { |list| fibers.concat(list.keys.map(&:fiber)) }
      (fibers + @unblockable.keys).uniq.reject { |fiber| fiber.equal?(Fiber.current) }
    end

    # This loop cannot watch a process: a thread waits instead (ProcessWaiting).
    def wait_child_exit(_pid) = nil
    def pidfd_open(_pid) = nil

    public

    # ---- the hooks (the IO ones in select_loop/io.rb) ------------------------------------------

    # (see Evt::Loop#io_select)
    def io_select(readables, writables = nil, exceptables = nil, timeout = nil)
      get
      timeout = interval(timeout)
      result = select_now(readables, writables, exceptables) # validates as IO.select does
      return result if result || timeout&.zero?

      watches = [[readables, IO::READABLE], [writables, IO::WRITABLE], [exceptables, IO::PRIORITY]]
                .flat_map { |ios, events| (ios || []).map { |object| [object.to_io, events] } }
      until_done(timeout) do |left|
        # Nothing to watch and no time limit: sleeps until interrupted.
        outcome = suspend(timeout: left, watches: watches, unblockable: watches.empty? && left.nil?,
                          what: [:select, watches.map(&:first)])
        raise IOError, "stream closed in another thread" if outcome == :closed

        select_now(readables, writables, exceptables) || (outcome == :timed_out ? false : nil)
      end || nil
    end

    # (see Evt::Loop#kernel_sleep)
    def kernel_sleep(*arguments)
      raise ArgumentError, "wrong number of arguments (given #{arguments.size}, expected 0..1)" if arguments.size > 1

      timeout = interval(arguments.first)
      get
      timeout&.zero? ? suspend(ready: true) : block_fiber(timeout)
      nil
    end

    # (see Evt::Loop#block)
    def block(blocker, timeout = nil)
      timeout = unchecked_interval(timeout)
      get
      block_fiber(timeout, blocker)
    end

    # (see Evt::Loop#unblock)
    def unblock(_blocker, fiber)
      check
      if Thread.current != @thread
        # Served by the loop, only if it has not resumed the fiber since: else the block this was for
        # is over. (Looked up now, the waiter could be missed: the fiber may be on its way into #block.)
        request(:unblock, fiber, (@resumes ||= ObjectSpace::WeakMap.new)[fiber] || 0)
      elsif (waiter = @unblockable[fiber])
        wake(waiter, :unblocked)
      elsif fiber == @current && !fiber.nil? && (fiber != @loop_fiber || @running.zero?)
        @early_unblock = fiber # running, not blocked yet: kept for its next block, as a thread's wakeup
      end
      nil
    end

    # (see Evt::Loop#timeout_after)
    def timeout_after(duration, exception_class, *arguments)
      raise LocalJumpError, "no block given (yield)" unless block_given?

      timeout = unchecked_interval(duration)
      get
      return yield(duration) if timeout.nil?

      exception = if exception_class.respond_to?(:exception) then exception_class.exception(*arguments)
                  elsif exception_class.is_a?(String) && arguments.empty? then RuntimeError.new(exception_class)
                  end
      raise TypeError, "exception class/object expected" unless exception.is_a?(Exception)

      timer = add_timer(now + timeout, Timeout.new(Fiber.current, exception))
      begin
        yield(duration)
      ensure
        remove_timer(timer)
      end
    end

    # (see Evt::Loop#io_close)
    def io_close(fd)
      get
      return false if fd.negative?

      Fiber.blocking { IO.for_fd(fd, autoclose: true).close } # blocking: else it comes back here
      true
    rescue Errno::EBADF
      false
    end

    # (see Evt::Loop#fiber_interrupt)
    def fiber_interrupt(fiber, exception)
      missing = %i[alive? raise transfer].find { |name| !fiber.respond_to?(name) } unless fiber.is_a?(Fiber)
      if missing
        raise TypeError, "evt: fiber_interrupt needs a Fiber, or an object that answers alive?, raise and " \
                         "transfer; #{fiber.class} does not answer #{missing}"
      end
      # Dropped when the wait it is for is over (#outdated?): Ruby 4.0's IO#close interrupts the
      # fibers in a read, write or wait of the IO, and a fiber already made ready by an event, or
      # running (another thread's close can come while this loop runs Ruby code in its read), leaves
      # it on its own; the exception would land in whatever it waits for next, such as a finalizer's.
      # (A stand-in's fiber is not the loop's to count.)
      resumed = fiber.is_a?(Fiber) && ((@resumes ||= ObjectSpace::WeakMap.new)[fiber] || 0)
      closing = Thread.current[:__evt_closing] # the C extension's IO#close notes an IO, or an Array of them
      closing = [closing] unless closing.nil? || closing.is_a?(Array)
      request(:interrupt, fiber, [exception, resumed, resumed && !closing ? waited_ios(fiber) : [], closing])
      nil
    end

    # (see Evt::Loop#run)
    def run
      get
      unless Fiber.current.equal?(@loop_fiber)
        raise FiberError, "evt: the loop is already running on another fiber" if @running.positive?
        unless Fiber.current.blocking?
          raise FiberError, "evt: the loop runs on a blocking fiber (the one that drives the scheduler), " \
                            "not inside a scheduled fiber"
        end

        @loop_fiber = Fiber.current
      end
      run_loop(nil)
      self
    end

    # (see Evt::Loop#scheduler_close)
    def scheduler_close
      get
      if Fiber.current != @loop_fiber && (@running.positive? || !Fiber.current.blocking?)
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

    # (see Evt::Loop#wakeup)
    def wakeup
      check
      signal if @blocked
      nil
    end
  end
end

require_relative "select_loop/io"
require_relative "select_loop/insight"
require_relative "select_loop/close_watch"
