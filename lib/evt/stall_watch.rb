# frozen_string_literal: true

module Evt
  # A stall: a fiber, or the thread's own code between the loop's turns, held the thread past the
  # threshold without returning to the loop, while other fibers waited. {StallWatch} reports each
  # one while it goes on (:ongoing, at the threshold, then at 2, 4, 8... times it) and once when it
  # is over (:ended, with its whole length).
  #
  # @!attribute [rw] state
  #   @return [Symbol] :ongoing or :ended
  # @!attribute [rw] fiber
  #   @return [Fiber, nil] the fiber that holds (held) the thread; a blocking one is the thread's own
  #     code (the fiber that drives the loop)
  # @!attribute [rw] thread
  #   @return [Thread] the loop's thread
  # @!attribute [rw] duration
  #   @return [Float] seconds, so far (:ongoing) or in all (:ended)
  # @!attribute [rw] backtrace
  #   @return [Array<String>, nil] where the thread was in most of the samples (the latest of those
  #     tied), innermost first; nil for a stall that ended before the watch could look
  # @!attribute [rw] samples
  #   @return [Integer] backtraces taken during the stall
  StallReport = Struct.new(:state, :fiber, :thread, :duration, :backtrace, :samples, keyword_init: true) do
    # @return [String] one line: what, how long, where
    def to_s
      where = backtrace ? " at #{backtrace.first(4).join(" < ")}" : ""
      format("evt: stall %s: %s held %s for %.3f s (%d samples)%s", state, fiber.inspect, thread.inspect,
             duration, samples, where)
    end

    # @return [String] one JSON object (NDJSON's line, without the newline)
    def to_json(*)
      require "json"
      JSON.generate({ event: "stall", state: state, fiber: fiber.inspect, thread: thread.inspect, pid: Process.pid,
                      duration: duration, samples: samples, backtrace: backtrace })
    end
  end

  # The stall watch of a scheduler made with `stall:` (or EVT_STALL): a thread that looks at the
  # loop every quarter of the threshold. The loop only notes the time at each pass through it (one
  # clock reading per fiber switch while a watch is on, none when off: then there is no watch and
  # no thread). A look that finds the thread away from the loop past the threshold, while fibers
  # wait, takes the thread's backtrace, and reports. A thread that runs Ruby code without waiting
  # gives the watch its turn at Ruby's thread switch, every 100 ms (RUBY_THREAD_TIMESLICE); one
  # inside C code that keeps the GVL cannot be seen until that code returns.
  class StallWatch
    # Nanoseconds in a second.
    # @api private
    NS = 1_000_000_000

    # The threshold in seconds: `requested`, else EVT_STALL (milliseconds), else nil (off).
    # @api private
    # @param requested [Numeric, nil]
    # @return [Float, nil]
    # @raise [ArgumentError] not a positive number
    def self.threshold(requested)
      if requested.nil?
        from_env = ENV.fetch("EVT_STALL", "")
        return nil if from_env.empty?

        milliseconds = Float(from_env, exception: false)
        raise ArgumentError, "evt: EVT_STALL must be a number of milliseconds > 0, not #{from_env.inspect}" unless milliseconds&.positive?

        return milliseconds / 1000.0
      end
      raise ArgumentError, "evt: stall must be a number of seconds > 0, not #{requested.inspect}" unless requested.is_a?(Numeric) && requested.positive?

      requested.to_f
    end

    # Starts the watch of `scheduler`'s loop.
    # @param scheduler [Scheduling] the scheduler (its loop notes the time from now on)
    # @param threshold [Float] seconds
    # @param on_stall [#call, nil] given each {StallReport}; nil prints it on $stderr
    def initialize(scheduler, threshold, on_stall = nil)
      @scheduler = scheduler
      @threshold = (threshold * NS).to_i
      @on_stall = on_stall || method(:print)
      @json = ENV["EVT_STALL_FORMAT"] == "json"
      @stop = Thread::Queue.new
      scheduler.send(:stall_threshold=, @threshold)
      @thread = Thread.new { watch }
      @thread.name = "evt stall watch"
      @thread.report_on_exception = false
    end

    # Ends the watch: its thread ends, and the loop stops noting the time.
    # @return [nil]
    def stop
      @stop.close
      @thread.join unless Thread.current == @thread
      @scheduler.send(:stall_threshold=, nil) unless @scheduler.closed?
      nil
    end

    private

    # backtraces: backtrace => how many samples found it
    Stall = Struct.new(:beat, :fiber, :backtraces, :samples, :next_report) do
      # @return [Array<String>, nil] the backtrace most samples found (of a tie, the latest)
      def backtrace = backtraces.to_a.reverse.max_by { |_, count| count }&.first
    end
    private_constant :Stall

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

    def watch
      interval = [@threshold / 4.0 / NS, 0.005].max
      ended_seen = state[2]
      stall = nil
      stopping = false
      until stopping
        @stop.pop(timeout: interval)
        beat, holder, ended, ended_ns, ended_fiber, thread = state
        # A last look, for a stall that ended as the scheduler closed (or its thread, unclosed):
        stopping = @stop.closed? || !thread&.alive?
        if ended != ended_seen
          ended_seen = ended
          same = stall && stall.beat != beat
          report(:ended, same ? stall.fiber : ended_fiber, thread, ended_ns, same ? stall : nil)
          stall = nil if same
        end
        stall = nil if stall && stall.beat != beat
        next if stopping || !beat || (held = now - beat) < @threshold

        stall ||= Stall.new(beat, holder, {}, 0, @threshold)
        sample = thread&.backtrace
        if sample
          stall.backtraces[sample] = stall.backtraces.delete(sample).to_i + 1 # the latest found last
          stall.samples += 1
        end
        next if held < stall.next_report

        stall.next_report *= 2 while stall.next_report <= held
        report(:ongoing, stall.fiber, thread, held, stall)
      end
    end

    # [beat (nil: not held), the fiber the loop switched to last, stalls ended, the last one's ns,
    # its fiber, the loop's thread]
    def state
      @scheduler.send(:stall_state)
    end

    def report(state, fiber, thread, ns, stall)
      @on_stall.call(StallReport.new(state: state, fiber: fiber, thread: thread, duration: ns.to_f / NS,
                                     backtrace: stall&.backtrace, samples: stall ? stall.samples : 0))
    rescue StandardError => e
      warn "evt: the stall report handler raised #{e.class}: #{e.message}"
    end

    def print(report)
      $stderr.write("#{@json ? report.to_json : report}\n")
    end
  end
end
