# frozen_string_literal: true

module Evt
  # One fiber a scheduler holds, as {Insight#fibers} lists it and {Evt.dump} prints it.
  #
  # @!attribute [rw] fiber
  #   @return [Fiber]
  # @!attribute [rw] state
  #   @return [Symbol] :running (it has the thread), :ready (it runs at the loop's next turn) or
  #     :suspended (it waits)
  # @!attribute [rw] wait
  #   @return [Symbol, nil] what it waits for: :io (an IO, see {#fd} and {#events}), :sleep (sleep,
  #     Mutex#sleep, ConditionVariable#wait), :block (a Queue, SizedQueue, Mutex or Thread#join:
  #     {#subject} is the blocker), :select (IO.select: the IOs), :process (Process.wait: the pid),
  #     :blocking (an operation on the blocking pool), :resolve (a host name), :close (an IO#close
  #     waiting for the IO's other waiters to leave), :yield (sleep(0), Fiber.yield's kin: ready again at
  #     once), :start (it started another fiber and goes on once that one waits), :switched (it
  #     switched to a fiber that was made to leave its wait); nil while it runs
  # @!attribute [rw] subject
  #   @return [Object, nil] what {#wait} names: the IO, the blocker, the IOs, the pid, the operation
  # @!attribute [rw] fd
  #   @return [Integer, nil] an :io wait's descriptor
  # @!attribute [rw] events
  #   @return [Array<Symbol>] an :io wait's events, of :read, :priority and :write
  # @!attribute [rw] since
  #   @return [Float, nil] when the wait began, on the monotonic clock
  #     (Process.clock_gettime(Process::CLOCK_MONOTONIC)), to the loop's turn
  # @!attribute [rw] deadline
  #   @return [Float, nil] seconds until the wait's own time limit (sleep's, a read's IO#timeout)
  # @!attribute [rw] timeout
  #   @return [Float, nil] seconds until the innermost Timeout.timeout around it fires
  # @!attribute [rw] backtrace
  #   @return [Array<String>, nil] where it is, innermost first
  FiberState = Struct.new(:fiber, :state, :wait, :subject, :fd, :events, :since, :deadline, :timeout, :backtrace,
                          keyword_init: true) do
    # @return [Float, nil] seconds it has waited so far
    def waited = since && [Insight.clock - since, 0.0].max

    # The fiber as a dump's header line shows it: `fiber 1234 [io fd=7 read, 3.2 s, timeout in 0.8 s]`.
    # @return [String]
    def to_s
      what = [wait ? wait.to_s : state.to_s]
      what << "fd=#{fd}" if fd
      what << events.join("/") if events && !events.empty?
      what << describe_subject if subject && wait != :io
      details = [what.join(" ")]
      details << state.to_s if wait && state != :suspended
      details << format("%.1f s", waited) if waited
      details << format("deadline in %.1f s", deadline) if deadline
      details << format("timeout in %.1f s", timeout) if timeout
      "fiber #{fiber.object_id} [#{details.join(", ")}]"
    end

    private

    def describe_subject
      case subject
      when Array then subject.map { |io| io.respond_to?(:fileno) && !io.closed? ? "fd=#{io.fileno}" : io.inspect }.join(",")
      when Integer then "pid=#{subject}"
      else subject.class.name || subject.inspect
      end
    end
  end

  # What a scheduler shows of itself: {#stats}, {#fibers}. Included in {Scheduling}, so both
  # schedulers have it; the loop's half is ext/evt/insight.c (the pure-Ruby loop's,
  # select_loop/insight.rb).
  module Insight
    # The events of an :io wait, by bit.
    EVENT_NAMES = { IO::READABLE => :read, IO::PRIORITY => :priority, IO::WRITABLE => :write }.freeze

    # @api private
    # @return [Float] the monotonic clock, in seconds
    def self.clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # @api private
    # @return [ObjectSpace::WeakMap] this Ractor's schedulers (scheduler => true), for {Evt.dump}
    def self.schedulers = Ractor.current[:evt_schedulers] ||= ObjectSpace::WeakMap.new

    # The loop's counters, always kept (a few additions per turn). Every key:
    # - `:backend` the backend in use;
    # - `:turns` the loop's turns; `:kernel_waits` the backend's waits (epoll_wait, poll, select,
    #   io_uring_enter that reaps), blocking or not; `:events` the readiness events and completions
    #   they handed to fibers, and `:events_per_turn`;
    # - `:busy_seconds`, `:kernel_seconds`: the loop's life (since it was made) split into the time
    #   its thread was blocked in the kernel waiting for events and the rest; `:utilization` the
    #   busy share, 0.0 (idle) to 1.0 (never waits);
    # - `:fibers_started`, `:fibers_finished`, `:fibers_alive` (Fiber.schedule's fibers),
    #   `:fibers_ready` (now) and `:fibers_ready_max` (at a turn's start, the most),
    #   `:fibers_suspended` (now), and `:waits`: the suspended fibers by {FiberState#wait} kind;
    # - `:timers_armed`, `:timers_pending`, `:timers_fired`, and how late they fired:
    #   `:timer_late_p50`, `:timer_late_p99` in seconds (to within a factor of two);
    # - `:requests`: what other threads asked of the loop (closes of IOs it waits on, Fiber
    #   interrupts);
    # - `:pool`: the blocking pool's `{queued:, running:, done:}` operations;
    # - io_uring only: `:submissions` (requests handed to the kernel), `:completions` (reaped),
    #   `:overflows` (reaps that found completions the kernel had held back).
    # @return [Hash{Symbol => Object}] a new Hash each call
    def stats
      counts = super
      waits = wait_counts(@doing.empty? ? nil : @doing)
      @doing.each_value { |kind, _, _| waits[kind] = waits.fetch(kind, 0) + 1 }
      counts.merge(fibers_started: @fibers_started, fibers_finished: @fibers_finished,
                   fibers_alive: @fibers_started - @fibers_finished, waits: waits,
                   pool: @pool ? @pool.stats : { queued: 0, running: 0, done: 0 })
    end

    # Why this scheduler's backend is not a faster one: each backend faster than the one in use that
    # cannot run here, with why (io_uring refused by a seccomp filter or the kernel.io_uring_disabled
    # sysctl, a kernel without it...), and `:extension` with why when the C extension is not loaded.
    # EVT_DEBUG=1 prints it once, for the first scheduler (of each Ractor).
    # @example In a container whose seccomp profile leaves io_uring out
    #   Evt::Scheduler.new.backend_fallbacks
    #   # => {io_uring: "io_uring is refused by this process's seccomp filter (as a container's default profile does)"}
    # @return [Hash{Symbol => String}] empty when the fastest backend of this build is in use
    def backend_fallbacks
      names = Evt.extension? ? Loop.backends : []
      faster = names.first(names.index(backend) || names.size)
      fallbacks = faster.to_h { |name| [name, Loop.probe(name)] }.compact
      fallbacks[:extension] = EXTENSION_MISSING if EXTENSION_MISSING
      fallbacks
    end

    # Every fiber the loop holds: the one running (when asked from it, or from another thread while
    # it runs), the ready ones and the suspended ones, with what each waits for and since when,
    # longest waiting first.
    # @param backtraces [Boolean] whether to take each fiber's backtrace (the costly part)
    # @return [Array<FiberState>]
    def fibers(backtraces: true)
      fiber_states(backtraces: backtraces).values.sort_by { |state| [state.state == :running ? 0 : 1, state.since || Float::INFINITY] }
    end

    private

    # What #doing marks: fiber => [kind, subject, since] for the waits the loop sees only as their
    # parts (a process wait on a pidfd, a blocking operation's queue).
    def insight_setup
      @fibers_started = @fibers_finished = 0
      @doing = {}.compare_by_identity
      Insight.schedulers[self] = true
    end

    # EVT_DEBUG=1: the backend and why not a faster one, on $stderr, for the Ractor's first scheduler.
    def debug_backend
      return unless ENV["EVT_DEBUG"] == "1" && !Ractor.current[:evt_debugged]

      Ractor.current[:evt_debugged] = true
      why = backend_fallbacks.map { |name, reason| "#{name}: #{reason}" }.join("; ")
      warn "evt: the #{backend} backend#{why.empty? ? ", the fastest of this build" : " (not faster ones: #{why})"}"
    end

    # Runs the block with the current fiber shown as waiting for `kind` of `subject`.
    def doing(kind, subject)
      fiber = Fiber.current
      @doing[fiber] = [kind, subject, Insight.clock]
      yield
    ensure
      @doing.delete(fiber)
    end

    def fiber_states(backtraces:)
      now = Insight.clock
      states = {}.compare_by_identity
      timeouts = {}.compare_by_identity
      waits.each do |fiber, state, kind, subject, fd, events, since, deadline|
        next unless fiber.is_a?(Fiber)
        next timeouts[fiber] = [timeouts[fiber], deadline].compact.min if kind == :timeout

        states[fiber] ||= FiberState.new(
          fiber: fiber, state: state, wait: kind, subject: subject, fd: fd,
          events: EVENT_NAMES.filter_map { |bit, name| name if events.anybits?(bit) },
          since: since && since / 1e9, deadline: deadline && [deadline / 1e9 - now, 0.0].max
        )
      end
      _, current, _, _, _, thread = stall_state
      current = Fiber.current if Thread.current == thread && !Fiber.current.blocking?
      if current.is_a?(Fiber) && !current.blocking? && current.alive? && !states.key?(current)
        states[current] = FiberState.new(fiber: current, state: :running, events: [])
      end
      @doing.each do |fiber, (kind, subject, since)|
        states[fiber]&.then { |state| state.wait, state.subject, state.since, state.fd, state.events = kind, subject, since, nil, [] }
      end
      states.each_value do |state|
        timeout = timeouts[state.fiber]
        state.timeout = [timeout / 1e9 - now, 0.0].max if timeout
        state.backtrace = backtrace_of(state, thread) if backtraces
      end
      states
    end

    def backtrace_of(state, thread)
      return caller.drop_while { |frame| frame.start_with?(__FILE__) } if state.fiber.equal?(Fiber.current)
      return thread&.backtrace if state.state == :running

      state.fiber.backtrace
    rescue StandardError
      nil
    end
  end

  class << self
    # Prints every scheduler of this Ractor, each fiber with what it waits for, for how long and
    # where (Go's goroutine dump, in Ruby): the running fiber first, then the longest waiting. The
    # loops go on meanwhile. From a signal, {dump_on} sets it up.
    # @param io [IO] where to print
    # @return [nil]
    def dump(io = $stderr)
      text = +"evt: dump of pid #{Process.pid} at #{Time.now.utc.strftime("%FT%T.%LZ")}\n"
      Insight.schedulers.each_key do |scheduler|
        next if scheduler.closed?

        text << dump_text(scheduler)
      rescue StandardError => e
        text << "evt: #{scheduler.class}: #{e.class}: #{e.message}\n"
      end
      Fiber.blocking { io.write(text) } # not through a scheduler: a dump must not wait for one
      nil
    end

    # Prints {dump} on `signal` (as EVT_DUMP_SIGNAL=QUIT does from the first scheduler), from a
    # thread of its own: the trap handler itself only starts it, so whatever the signal
    # interrupts goes on.
    # @param signal [String, Symbol, Integer] as Signal.trap takes it
    # @param io [IO] where to print
    # @return [Object] the signal's previous handler
    def dump_on(signal, io = $stderr)
      Signal.trap(signal) { Thread.new { dump(io) } }
    end

    private

    def dump_text(scheduler)
      stats = scheduler.stats
      text = +"\nscheduler #{scheduler.object_id} (#{stats[:backend]}): #{stats[:fibers_alive]} fibers, " \
              "#{stats[:fibers_ready]} ready, #{stats[:fibers_suspended]} suspended, " \
              "utilization #{format("%.2f", stats[:utilization])}\n"
      scheduler.fibers.each do |state|
        text << "\n#{state}:\n"
        (state.backtrace || ["(no backtrace)"]).each { |line| text << "\t#{line}\n" }
      end
      text
    end
  end
end
