# frozen_string_literal: true

require "etc"
require "socket"

module Evt
  # One event loop per core: a supervisor process forks N worker processes, each running the block
  # in its own {Evt.run}, all serving the same listening socket(s) made before the fork (the kernel
  # hands each connection to one worker). The way Puma's cluster mode, Unicorn and Falcon run Ruby
  # servers on every core, without touching the GVL.
  #
  #   server = TCPServer.new("0.0.0.0", 8080)
  #   Evt::Workers.new(count: 4).run do |worker|
  #     until worker.stopping?
  #       client = server.accept
  #       Fiber.schedule { serve(client) }
  #     end
  #   rescue IOError
  #     nil # the listener was closed: stop accepting, let the requests in flight finish
  #   end
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
  class Workers
    # What a worker's block gets: its number, whether it is stopping, and a place for stop hooks.
    class Worker
      # @return [Integer] 0 ... count, kept across restarts
      attr_reader :index

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

      # Runs +block+ (in the worker's event loop) when the worker is told to stop.
      def on_stop(&block)
        @on_stop << block
        self
      end

      # Stops accepting: closes the listeners and runs the stop hooks. Called by the worker's SIGTERM.
      def stop
        return if @stopping

        @stopping = true
        @listeners.each { |listener| listener.close unless listener.closed? }
        @on_stop.each(&:call)
      end
    end

    SIGNALS = %w[TERM INT HUP CHLD].freeze

    # @return [Integer] how many worker processes run at once
    attr_reader :count

    # @param count [Integer] worker processes (one per core by default)
    # @param listeners [Array<IO>] sockets every worker serves; each worker closes its copies when
    #   told to stop (a listener made inside the block is the block's to close, on #on_stop)
    # @param stop_timeout [Numeric] seconds a stopping worker may take before it is killed
    # @param backend [Symbol, String, nil] the workers' scheduler backend (see {Scheduler#initialize})
    def initialize(count: Etc.nprocessors, listeners: [], stop_timeout: 30, backend: nil)
      raise ArgumentError, "evt: count must be a positive Integer, not #{count.inspect}" unless count.is_a?(Integer) && count.positive?

      @count = count
      @listeners = Array(listeners)
      @stop_timeout = stop_timeout
      @backend = backend
      @workers = {} # pid => index
      @restarts = 0
    end

    # @return [Array<Integer>] the pids of the workers running now
    def pids
      @workers.keys
    end

    # @return [Integer] how many workers were started again after they died
    attr_reader :restarts

    # Starts the workers and supervises them until SIGTERM or SIGINT (or #stop from another thread)
    # has stopped them all. Call it from a process with no scheduler set.
    # @yieldparam worker [Worker]
    # @return [self]
    def run(&block)
      raise ArgumentError, "evt: Workers#run needs a block" unless block
      raise "evt: Workers#run runs the supervisor: call it outside a scheduler" if Fiber.scheduler

      @block = block
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
        [@events, @notify, @alive_r, @alive_w].each(&:close)
      end
      self
    end

    # Asks #run to stop the workers gracefully and return (from another thread, or a signal handler).
    def stop
      tell("TERM")
    end

    # Asks #run to replace the workers one at a time, as SIGHUP does.
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
        case @events.gets&.chomp
        when "CHLD" then reap { |index| spawn(index) }
        when "HUP" then roll
        when "TERM", "INT"
          stop_workers(pids)
          return
        end
      end
    end

    # Reaps the workers that ended, yielding the index of each one that died (not one told to stop).
    def reap
      while (pid = Process.wait(-1, Process::WNOHANG))
        index = @workers.delete(pid)
        next unless index

        @restarts += 1
        yield index
      end
    rescue Errno::ECHILD
      nil
    end

    def spawn(index)
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
      worker = Worker.new(index, @listeners)
      stops = Thread::Queue.new
      %w[TERM INT].each { |signal| trap(signal) { stops << signal } }
      Evt.run(backend: @backend) do
        # Told to stop (a signal), or orphaned (the supervisor died): stop accepting; the fibers
        # in flight finish.
        watchers = [
          Fiber.schedule { stops.pop && worker.stop },
          Fiber.schedule { @alive_r.read && worker.stop }, # end of file: the supervisor is gone
        ]
        @block.call(worker)
        # The block is over: the watchers have nothing left to stop.
        watchers.each { |fiber| fiber.kill if fiber.alive? }
      end
    end

    # SIGHUP: a new worker first, then the old one stops; one index at a time.
    def roll
      @workers.to_a.each do |old_pid, index|
        spawn(index)
        stop_workers([old_pid])
      end
    end

    # Stops the given workers gracefully, killing those still busy after stop_timeout.
    def stop_workers(targets)
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
