# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's half of what a loop shows of itself (as ext/evt/insight.c for the C
    # loop): its counters, its waits, the stall watch's view.

    # (see Evt::Loop#stats)
    def stats
      check
      current = now
      lived = current - @made
      kernel = @kernel_ns + (@blocked ? [current - @clock, 0].max : 0) # a wait under way is waiting already
      busy = [lived - kernel, 0].max
      fired = @late.sum
      { backend: @backend, turns: @turns, fibers_ready: @ready.count { |waiter| waiter.state == :ready },
        fibers_ready_max: @ready_max, fibers_suspended: @waiting, busy_seconds: busy / 1e9,
        kernel_seconds: kernel / 1e9, utilization: lived.positive? ? busy.to_f / lived : 0.0,
        kernel_waits: @kernel_waits, events: @events, events_per_turn: @turns.zero? ? 0.0 : @events.to_f / @turns,
        timers_armed: @sequence, timers_pending: @timers.size, timers_fired: fired,
        timer_late_p50: late_at(fired / 2), timer_late_p99: late_at(fired - ((fired + 99) / 100)),
        requests: @requests_served }
    end

    private

    def insight_reset
      @made = @clock = now
      @turns = @kernel_waits = @events = @kernel_ns = @requests_served = @ready_max = 0
      @late = Array.new(24, 0) # timers fired, by how late: under 2**i µs (the last: the rest)
      @stall ||= nil # the threshold in ns, or nil
      @beat = @clock
      @ended = [0, 0, nil] # stalls over: how many, the last one's ns and fiber
    end

    def count_late(late)
      microseconds = late / 1000
      @late[[microseconds.positive? ? microseconds.bit_length : 0, @late.size - 1].min] += 1
    end

    def late_at(rank)
      seen = 0
      @late.each_with_index do |count, i|
        seen += count
        return i.zero? ? 1e-6 : (2**i) / 1e6 if seen > rank
      end
      0.0
    end

    # (see ext/evt/insight.c's waits)
    def waits
      check
      list = []
      seen = {}.compare_by_identity
      add = lambda do |waiter|
        next if seen[waiter] || waiter.state == :done

        seen[waiter] = true
        kind, subject = waiter.what || [:switched, nil]
        events = kind == :io ? waiter.watches.first[1] : 0
        fd = subject.fileno if kind == :io && !subject.closed?
        list << [waiter.fiber, waiter.state == :ready ? :ready : :suspended, kind, subject, fd, events, waiter.since,
                 waiter.timer&.deadline]
      end
      @ready.each(&add)
      @watched.each_value { |waiters| waiters.each_key(&add) }
      @unblockable.each_value(&add)
      @timers.each do |timer|
        target = timer.target
        next add.call(target) if target.is_a?(Waiter)

        list << [target.fiber, nil, :timeout, nil, nil, 0, nil, timer.deadline]
      end
      list
    end

    # (see ext/evt/insight.c's wait_counts)
    def wait_counts(skipped = nil)
      counts = Hash.new(0)
      waits.each { |fiber, _, kind| counts[kind] += 1 unless kind == :timeout || skipped&.key?(fiber) }
      counts.default = nil
      counts
    end

    def stall_threshold=(ns)
      @beat = now
      @stall = ns
    end

    # (see ext/evt/insight.c's stall_state)
    def stall_state
      held = @stall && !@blocked && (@waiting.positive? || !@current.equal?(@loop_fiber))
      [held ? @beat : nil, @current, *@ended, @thread]
    end

    # The thread passes through the loop: a hold by `holder` (nil: the kernel's wait) past the
    # threshold is over (the thread's own code's, the loop fiber's, only while fibers waited).
    def beat(holder)
      time = now
      if holder && time - @beat >= @stall && (!holder.equal?(@loop_fiber) || @waiting.positive?)
        @ended = [@ended[0] + 1, time - @beat, holder]
      end
      @beat = time
    end
  end
end
