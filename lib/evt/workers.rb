# frozen_string_literal: true

require "etc"
require "socket"

module Evt
  # One event loop per core: a supervisor process forks N worker processes, each running the block
  # in its own {Evt.run}, all serving the same listening socket(s) made before the fork (the kernel
  # hands each connection to one worker). The way Puma's cluster mode, Unicorn and Falcon run Ruby
  # servers on every core, without touching the GVL. docs/workers.md has the details.
  #
  # Supervision, in the supervisor (the process that called #run):
  # - a worker that dies is started again;
  # - SIGTERM or SIGINT: every worker stops gracefully, then #run returns;
  # - SIGHUP: the workers are replaced one at a time, each new one started before the old one
  #   stops, so connections keep being accepted throughout.
  #
  # A worker stops gracefully on SIGTERM (or SIGINT): it closes the listeners it was given (the
  # fiber blocked in accept raises IOError) and runs #on_stop's blocks, then the requests in flight
  # finish and Evt.run returns. A worker still busy after `stop_timeout` seconds is killed.
  #
  # With `ractors: N` the workers are Ractors of this process instead (one copy of the code and of
  # what the block shares), each with its own loop and its own descriptor of every listener
  # (Worker#listeners; the block may not use the caller's variables: see #run). Supervision is the
  # same, the signals being the supervisor's; a Ractor cannot be killed, so one still busy after
  # stop_timeout is left to end with the process. Ruby 3.3 and 3.4 crash with fibers in two Ractors
  # at once (ruby/ruby#13466), so there `ractors:` may be 1 only.
  #
  # @example A server on four worker processes
  #   server = TCPServer.new("0.0.0.0", 8080)
  #   Evt::Workers.new(count: 4, listeners: [server]).run do |worker|
  #     until worker.stopping?
  #       client = server.accept
  #       Fiber.schedule { serve(client) }
  #     end
  #   rescue IOError
  #     nil # told to stop: the listener closed; the requests in flight finish
  #   end
  # @example Worker Ractors (Ruby 4.0 for more than one): a shareable block, its own listeners
  #   server = TCPServer.new("0.0.0.0", 8080)
  #   body = nil.instance_exec do
  #     proc do |worker|
  #       listener = worker.listeners.first # this Ractor's own
  #       until worker.stopping?
  #         client = listener.accept
  #         Fiber.schedule { MyApp.serve(client) }
  #       end
  #     rescue IOError
  #       nil
  #     end
  #   end
  #   Evt::Workers.new(ractors: 2, listeners: [server]).run(body)
  class Workers
    # What a worker's block gets: its number, whether it is stopping, and a place for stop hooks.
    class Worker
      # @return [Integer] 0 ... count, kept across restarts
      attr_reader :index
      # @return [Array<IO>] the listeners, as this worker's own IOs (its Ractor's, with `ractors:`)
      attr_reader :listeners

      # Made by {Workers} for each worker it starts.
      # @api private
      # @param index [Integer]
      # @param listeners [Array<IO>]
      def initialize(index, listeners)
        @index = index
        @listeners = listeners
        @stopping = false
        @on_stop = []
      end

      # @return [Boolean] whether the worker was told to stop (it accepts no new work then)
      def stopping?
        @stopping
      end

      # Runs `block` (in the worker's event loop) when the worker is told to stop: for what the
      # block made itself, a listener to close, a connection pool to drain.
      # @example
      #   worker.on_stop { own_listener.close }
      # @yield in the worker's event loop
      # @return [self]
      def on_stop(&block)
        @on_stop << block
        self
      end

      # Stops accepting: closes the listeners and runs the stop hooks, once. Called by the worker's
      # SIGTERM (or the supervisor's word, for a Ractor).
      # @return [void]
      def stop
        return if @stopping

        @stopping = true
        @listeners.each { |listener| listener.close unless listener.closed? }
        @on_stop.each(&:call)
      end
    end

    # The signals the supervisor traps while #run lasts (their handlers come back afterwards).
    # @api private
    SIGNALS = %w[TERM INT HUP CHLD].freeze

    # A worker that ends within this many seconds of its start failed to boot (a missing file, a
    # port in use): it is started again only after a back-off, which doubles from BACKOFF_FIRST at
    # each such end in a row, up to BACKOFF_MAX. One that lived longer is started again at once.
    QUICK_END = 5
    # @see QUICK_END
    BACKOFF_FIRST = 0.1
    # @see QUICK_END
    BACKOFF_MAX = 10

    # Whether this Ruby runs fibers in several Ractors at once (see the class's notes): 4.0 and
    # later, which have ruby/ruby#13466's fix.
    PARALLEL_RACTOR_FIBERS = RUBY_VERSION >= "4"

    # @return [Integer] how many workers run at once
    attr_reader :count

    # Workers to start with {#run}; nothing starts yet.
    # @param count [Integer] worker processes (one per core by default)
    # @param ractors [Integer, nil] Ractors instead of processes: how many
    # @param listeners [Array<IO>] sockets every worker serves; each worker closes its copies when
    #   told to stop (a listener made inside the block is the block's to close, on #on_stop)
    # @param stop_timeout [Numeric] seconds a stopping worker may take before it is killed
    # @param backend [Symbol, String, nil] the workers' scheduler backend (see {Scheduler#initialize})
    # @raise [ArgumentError] count and ractors both given, a count that is not a positive Integer,
    #   or more than one Ractor on Ruby 3.3 or 3.4
    def initialize(count: nil, ractors: nil, listeners: [], stop_timeout: 30, backend: nil)
      raise ArgumentError, "evt: count (processes) or ractors, not both" if count && ractors

      count = ractors || count || Etc.nprocessors
      raise ArgumentError, "evt: #{ractors ? "ractors" : "count"} must be a positive Integer, not #{count.inspect}" unless count.is_a?(Integer) && count.positive?
      if ractors && ractors > 1 && !PARALLEL_RACTOR_FIBERS
        raise ArgumentError, "evt: ractors: #{ractors} needs Ruby 4.0 or later: Ruby #{RUBY_VERSION} crashes with fibers " \
                             "in two Ractors at once (ruby/ruby#13466); use count: #{ractors} for worker processes"
      end

      @ractors = !ractors.nil?
      @count = count
      @listeners = Array(listeners)
      @stop_timeout = stop_timeout
      @backend = backend
      @workers = {} # pid (or Ractor) => index
      @ends = {} # a worker Ractor's object_id => [it, the thread that waits for its end, its stop pipe's write end]
      @restarts = 0
      @started = {} # index => when its worker last started (monotonic seconds)
      @quick_ends = Hash.new(0) # index => its workers' ends within QUICK_END of their start, in a row
      @due = {} # index => when its worker, ended quickly, is to start again
    end

    # @return [Array<Integer>] the pids of the worker processes running now (none with `ractors:`)
    def pids
      @ractors ? [] : @workers.keys
    end

    # @return [Integer] how many workers died and were (or are about to be) started again
    attr_reader :restarts

    # Starts the workers and supervises them until SIGTERM or SIGINT (or #stop from another thread)
    # has stopped them all. Call it from a process with no scheduler set.
    #
    # With `ractors:`, every worker Ractor calls the same block, which must be shareable: it may not
    # use the caller's local variables (the listeners are Worker#listeners), nor its self (make it
    # where self is shareable: `nil.instance_exec { proc { |worker| ... } }`, or in a module); a
    # shareable object that responds to #call(worker) does as well, given as the argument.
    # @param body [#call, nil] the block, as a shareable object answering call(worker) (`ractors:`)
    # @yieldparam worker [Worker]
    # @return [self]
    # @raise [ArgumentError] no block, or a Ractor worker's block that cannot be made shareable
    # @raise [RuntimeError] called where a scheduler is set
    def run(body = nil, &block)
      block ||= body
      raise ArgumentError, "evt: Workers#run needs a block" unless block
      raise "evt: Workers#run runs the supervisor: call it outside a scheduler" if Fiber.scheduler

      @block = @ractors ? shareable(block) : block
      # Signals reach the supervisor through a pipe (a queue would look like a deadlock to Ruby);
      # the workers hold the read end of another, whose end of file tells them the supervisor died.
      @events, @notify = IO.pipe
      @alive_r, @alive_w = IO.pipe
      previous = SIGNALS.to_h { |signal| [signal, trap(signal) { tell(signal) }] }
      begin
        @count.times { |index| spawn(index) }
        supervise
      ensure
        previous.each { |signal, handler| trap(signal, handler || "DEFAULT") }
        [@events, @notify, @alive_r, @alive_w, *@ends.values.map(&:last)].each(&:close)
      end
      self
    end

    # Asks #run to stop the workers gracefully and return (from another thread, or a signal handler).
    # @return [void]
    def stop
      tell("TERM")
    end

    # Asks #run to replace the workers one at a time, as SIGHUP does.
    # @return [void]
    def restart
      tell("HUP")
    end

    private

    def tell(signal)
      @notify&.write_nonblock("#{signal}\n", exception: false)
    rescue IOError
      nil # #run is over
    end

    def supervise
      loop do
        start_due
        # Until the next event, or the next worker due to start again.
        wait = @due.empty? ? nil : [@due.values.min - now, 0].max
        next unless IO.select([@events], nil, nil, wait)

        case (event = @events.gets&.chomp)
        when "CHLD" then @ractors || reap { |index| respawn(index) }
        when /\AENDED (\d+)\z/ then ractor_ended(Integer(::Regexp.last_match(1)))
        when "HUP" then roll
        when "TERM", "INT"
          @due.clear # not started again: stopping
          stop_workers(@workers.keys)
          return
        else
          raise "evt: the supervisor's pipe closed (#{event.inspect})" if event.nil?
        end
      end
    end

    # Reaps the workers that ended, yielding the index of each one that died (not one told to stop).
    def reap
      while (pid = Process.wait(-1, Process::WNOHANG))
        index = @workers.delete(pid)
        next unless index

        yield index
      end
    rescue Errno::ECHILD
      nil
    end

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # A worker died: started again now, or after the back-off when it ended soon after its start
    # (QUICK_END): a worker that cannot boot is not forked again and again at full speed.
    def respawn(index)
      @restarts += 1
      quick = now - @started.fetch(index) < QUICK_END
      @quick_ends[index] = quick ? @quick_ends[index] + 1 : 0
      return spawn(index) unless quick

      delay = [BACKOFF_FIRST * (2**(@quick_ends[index] - 1)), BACKOFF_MAX].min
      @due[index] = now + delay
      warn "evt: worker #{index} ended #{@quick_ends[index]} time(s) in a row within #{QUICK_END} s of its start; " \
           "starting it again in #{delay.round(1)} s"
    end

    # Starts the workers whose back-off is over.
    def start_due
      @due.select { |_, at| at <= now }.each_key do |index|
        @due.delete(index)
        spawn(index)
      end
    end

    def spawn(index)
      @started[index] = now
      return start_ractor(index) if @ractors

      pid = fork do
        SIGNALS.each { |signal| trap(signal, "DEFAULT") }
        work(index)
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- a worker's end, reported
        warn "evt: worker #{index} (#{Process.pid}) ended with #{e.class}: #{e.message}" unless e.is_a?(SignalException)
        exit!(1)
      end
      @workers[pid] = index
      pid
    end

    # In the worker: the block in an event loop, until it and every fiber it started are done.
    def work(index)
      [@events, @notify, @alive_w].each(&:close)
      stops = Thread::Queue.new
      %w[TERM INT].each { |signal| trap(signal) { stops << signal } }
      # Told to stop (a signal), or orphaned (end of file: the supervisor died).
      Workers.serve(Worker.new(index, @listeners), @backend, @block, [-> { stops.pop }, -> { @alive_r.read }])
    end

    # The block in `worker`'s own event loop. Each of `stops` waits (in a fiber) for a reason to
    # stop: then the worker stops accepting, and the fibers in flight finish. A class method, so
    # that a worker Ractor can call it.
    # @api private
    # @return [void]
    def self.serve(worker, backend, block, stops)
      Evt.run(backend: backend) do
        watchers = stops.map { |wait| Fiber.schedule { wait.call && worker.stop } }
        begin
          block.call(worker)
        ensure
          # The block is over (or failed): the watchers have nothing left to stop.
          watchers.each { |fiber| fiber.kill if fiber.alive? }
        end
      end
    end

    # ---- workers as Ractors ----------------------------------------------------------------------

    # The block, made shareable (Ractor.make_shareable freezes what it holds, deeply).
    def shareable(block)
      Ractor.make_shareable(block)
    rescue Ractor::Error, ArgumentError => e
      raise ArgumentError, "evt: a Ractor worker's block must be shareable (#{e.message}): reach the listeners " \
                           "through worker.listeners, and make the block where self is shareable " \
                           "(nil.instance_exec { proc { |worker| ... } }) or pass an object with #call(worker)"
    end

    # A Ractor running the block in its own loop on descriptors of its own: a copy of each listener's,
    # the read end of a pipe whose end of file tells it to stop, and the write end of one it closes
    # when it ends, which a thread here waits for to tell the supervisor. The Ractor owns those
    # descriptors: their IOs here never close them.
    def start_ractor(index)
      stop_r, stop_w = IO.pipe
      end_r, end_w = IO.pipe
      owned = [*@listeners.map { |io| io.to_io.dup }, stop_r, end_w].each { |io| io.autoclose = false }
      begin
        ractor = Ractor.new(index, owned.map { |io| [io.class, io.fileno] }, @backend, @block,
                            name: "evt worker #{index}") do |number, ios, backend, body|
          Workers.work_in_ractor(number, ios, backend, body)
        end
      rescue StandardError
        [*owned, stop_w, end_r].each(&:close) # the Ractor that was to own them never came
        raise
      end
      @workers[ractor] = index
      @ends[ractor.object_id] = [ractor, Thread.new { wait_for_end(ractor.object_id, end_r) }, stop_w]
      ractor
    end

    # The end of file of `end_r`: the Ractor's loop is over. (Not Ractor#take: on Ruby 3.3 and 3.4 one
    # of two threads taking from two Ractors at once was sometimes never woken.)
    def wait_for_end(id, end_r)
      Thread.current.report_on_exception = false
      end_r.read
    ensure
      end_r.close
      begin
        @notify&.write("ENDED #{id}\n") # blocking: this one must not be lost
      rescue IOError
        nil # #run is over
      end
    end

    # In the worker Ractor: the listeners are this Ractor's own descriptors; the supervisor's word
    # to stop is the end of file of the pipe that comes last, read by a fiber of the loop. (Not a
    # Ractor message: a thread waiting in Ractor.receive beside the loop can miss it, and the worker
    # would not stop.)
    # @api private
    # @return [nil]
    def self.work_in_ractor(index, descriptors, backend, body)
      ios = descriptors.map { |klass, fd| klass.for_fd(fd) }
      *listeners, stop, _ended = ios
      worker = Worker.new(index, listeners)
      serve(worker, backend, body, [-> { stop.read }])
      nil
    rescue Exception => e # rubocop:disable Lint/RescueException -- a worker's end, reported
      warn "evt: worker #{index} (#{Ractor.current.name}) ended with #{e.class}: #{e.message}"
    ensure
      [*ios].each { |io| io.close unless io.closed? } # the last one tells the supervisor
    end

    # A worker Ractor ended: started again unless it was told to stop (#stop_workers forgot it then).
    def ractor_ended(id)
      ractor, _, stop_w = @ends.delete(id)
      stop_w&.close
      index = @workers.delete(ractor)
      return unless index

      respawn(index)
    end

    # SIGHUP: a new worker first, then the old one stops; one index at a time. (Ractors where Ruby
    # cannot run fibers in two at once: the old one stops first; its listener's queue waits.)
    def roll
      @workers.to_a.each do |old, index|
        stop_workers([old]) if @ractors && !PARALLEL_RACTOR_FIBERS
        spawn(index)
        stop_workers([old]) unless @ractors && !PARALLEL_RACTOR_FIBERS
      end
    end

    # Stops the given workers gracefully, killing those still busy after stop_timeout (a Ractor
    # cannot be killed: one still busy is left to end with the process).
    def stop_workers(targets)
      return stop_ractors(targets) if @ractors

      targets.each { |pid| signal(pid, "TERM") }
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @stop_timeout
      remaining = targets.dup
      until remaining.empty?
        remaining.reject! { |pid| ended?(pid) }
        break if remaining.empty?

        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          remaining.each { |pid| signal(pid, "KILL") }
          remaining.each { |pid| wait_quietly(pid) }
          break
        end
        sleep 0.01
      end
      targets.each { |pid| @workers.delete(pid) }
    end

    def stop_ractors(targets)
      targets.each do |ractor|
        _, _, stop_w = @ends[ractor.object_id]
        stop_w.close unless stop_w.nil? || stop_w.closed? # end of file: stop
      end
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @stop_timeout
      targets.each do |ractor|
        _, ender = @ends[ractor.object_id]
        next if ender.nil? || ender.join([deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC), 0].max)

        warn "evt: worker #{@workers[ractor]} (#{ractor.name}) still busy after #{@stop_timeout} s; it ends with the process"
      end
      targets.each { |ractor| @workers.delete(ractor) }
    end

    def ended?(pid)
      !Process.wait(pid, Process::WNOHANG).nil?
    rescue Errno::ECHILD
      true
    end

    def wait_quietly(pid)
      Process.wait(pid)
    rescue Errno::ECHILD
      nil
    end

    def signal(pid, name)
      Process.kill(name, pid)
    rescue Errno::ESRCH
      nil
    end
  end
end
