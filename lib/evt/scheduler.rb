# frozen_string_literal: true

module Evt
  # Process.wait and friends for {Scheduler} and {Selector}: waits for `pid` without blocking the
  # other fibers. A child process is watched by the loop: waitid in the ring (io_uring, Linux 6.7),
  # EVFILT_PROC (kqueue), else a pidfd it polls. Any child (pid <= 0), stop and continue reports,
  # or none of these take a thread instead (killed if the wait is interrupted). The includer
  # defines wait_readable(io).
  module ProcessWaiting
    # Hook (Process.wait, Process.wait2, Process::Status.wait): waits for child `pid` while the
    # other fibers run.
    # @param pid [Integer] as Process.wait takes it (<= 0: any child of a group)
    # @param flags [Integer] Process::WNOHANG, Process::WUNTRACED, or'ed
    # @return [Process::Status, nil] nil with WNOHANG when no child has ended; a status with pid -1
    #   for "no such child", from which Ruby raises
    def process_wait(pid, flags)
      status = Process::Status.wait(pid, flags | Process::WNOHANG)
      return status if status || flags.anybits?(Process::WNOHANG)

      if pid.positive? && flags.zero?
        while wait_for_exit(pid)
          status = Process::Status.wait(pid, Process::WNOHANG)
          return status if status
        end
      end
      waiter = Thread.new do
        Thread.current.report_on_exception = false
        Process::Status.wait(pid, flags)
      end
      waiter.value
    ensure
      waiter&.kill
    end

    private

    # Waits in the loop until child `pid` has ended (or is gone); false when the loop has no way to
    # watch a process.
    def wait_for_exit(pid)
      exited = wait_child_exit(pid)
      return true unless exited.nil?

      descriptor = pidfd_open(pid) or return false
      pidfd = IO.for_fd(descriptor, autoclose: true)
      wait_readable(pidfd)
      true
    ensure
      pidfd&.close
    end
  end

  # The hooks written in Ruby, shared by {Scheduler} (on the C loop) and {SelectScheduler} (on the
  # pure-Ruby loop), and the methods code that drives a scheduler calls ({#close}, {#kill_all},
  # {#pool_size}). Prepended to each, so its methods come before the loop's, whichever loop that
  # is, and `super` reaches that loop. `is_a?(Evt::Scheduling)` tells either scheduler.
  module Scheduling
    include Insight

    # Takes the `pool_size:` option of {Scheduler.new} and {SelectScheduler#initialize
    # SelectScheduler.new}; the others go on to the class's own initialize.
    # @param arguments [Array] for the class's initialize
    # @param options [Hash] for the class's initialize (`backend:`)
    # @param pool_size [Integer, nil] threads for blocking operations ({#blocking_operation_wait},
    #   Ruby 3.4); 0 runs them on the loop's thread, as without a scheduler. nil: EVT_POOL_SIZE from
    #   the environment if set, else one per core.
    # Takes `stall:` and `on_stall:` too: see {StallWatch}.
    # @param stall [Numeric, nil] seconds: report a fiber (or the thread's own code) that holds the
    #   thread longer without returning to the loop; nil: EVT_STALL (milliseconds) if set, else off
    # @param on_stall [#call, nil] called with each {StallReport}, on the watch's thread; nil: one
    #   line each on $stderr (JSON with EVT_STALL_FORMAT=json)
    # @raise [ArgumentError] pool_size is not an Integer >= 0, or stall not a positive number
    # @param profiler [#start, #stop, nil, :default] a profiler run while the scheduler lives, as
    #   async runs one: started now, on this thread, and stopped by {#scheduler_close}. :default
    #   takes fiber-profiler's (Fiber::Profiler.default) when FIBER_PROFILER (watchdog, capture) or
    #   FIBER_PROFILER_CAPTURE=true is set and the gem is installed; nil: none.
    def initialize(*arguments, pool_size: nil, stall: nil, on_stall: nil, profiler: :default, **options)
      @pool_size = Scheduling.pool_size(pool_size)
      stall = StallWatch.threshold(stall)
      profiler = Scheduling.default_profiler if profiler == :default
      @pool = nil
      @stall_watch = nil
      insight_setup
      # Every scheduled fiber runs this one body, which takes its block and kind from @starting
      # (set just before the fiber starts, which it does at once): a block of its own per fiber would
      # cost a Proc and its environment each, and GC time for as long as the fiber lives.
      @fiber_body = method(:scheduled_fiber_body).to_proc
      @starting = @starting_child = nil
      super(*arguments, **options)
      @stall_watch = StallWatch.new(self, stall, on_stall) if stall
      @profiler = profiler&.tap(&:start)
      debug_backend
      Scheduling.warn_about_hiredis
      Scheduling.dump_on_signal
    end

    # fiber-profiler's default profiler when the environment asks for one (FIBER_PROFILER, or
    # FIBER_PROFILER_CAPTURE=true), else nil; nil with a warning when the gem is not installed.
    # @api private
    # @return [Object, nil]
    def self.default_profiler
      return nil unless ENV.fetch("FIBER_PROFILER", "") != "" || ENV["FIBER_PROFILER_CAPTURE"] == "true"

      require "fiber/profiler"
      ::Fiber::Profiler.default
    rescue LoadError => e
      warn "evt: FIBER_PROFILER is set, but fiber-profiler cannot be loaded (#{e.message}): no profiler"
      nil
    end

    # Sets up {Evt.dump_on} for EVT_DUMP_SIGNAL, once per process, from the main Ractor (the only
    # one that may trap signals).
    # @api private
    # @return [void]
    def self.dump_on_signal
      signal = ENV.fetch("EVT_DUMP_SIGNAL", "")
      return if signal.empty? || Ractor.current != Ractor.main || @dump_signal == [Process.pid, signal]

      @dump_signal = [Process.pid, signal]
      Evt.dump_on(signal)
    end

    # hiredis-client's connection waits for Redis with rb_thread_fd_select, which Ruby hands to no
    # Fiber Scheduler: each command stops the whole loop until Redis answers (a BLPOP for its whole
    # timeout). Said once per process, when a scheduler starts with hiredis as redis-client's
    # default driver, or when a hiredis connection opens under evt; one check each, nothing per command.
    # @api private
    HIREDIS_WARNING = "evt: hiredis-client's driver waits for Redis with rb_thread_fd_select, which Ruby does not " \
                      "hand to a Fiber Scheduler: every Redis command stops this thread's loop until Redis answers. " \
                      "Use redis-client's pure-Ruby driver (RedisClient.default_driver = :ruby, or driver: :ruby)"

    # Warns once if redis-client's default driver is hiredis, and has each hiredis connection made
    # under evt warn (see {HIREDIS_WARNING}).
    # @api private
    # @return [void]
    def self.warn_about_hiredis
      return unless defined?(::RedisClient::HiredisConnection)

      unless ::RedisClient::HiredisConnection.include?(HiredisWarning)
        ::RedisClient::HiredisConnection.prepend(HiredisWarning)
      end
      HiredisWarning.warn_once if ::RedisClient.default_driver == ::RedisClient::HiredisConnection
    end

    # Prepended to RedisClient::HiredisConnection once a scheduler has seen it loaded.
    # @api private
    module HiredisWarning
      @warned = false

      # Prints {HIREDIS_WARNING}, the first time only.
      # @return [void]
      def self.warn_once
        return if @warned

        @warned = true
        warn HIREDIS_WARNING
      end

      # A hiredis connection made in a fiber of an evt scheduler warns, then connects as before.
      def initialize(...)
        HiredisWarning.warn_once if Fiber.current_scheduler.is_a?(Evt::Scheduling)
        super
      end
    end

    # The pool size to use: `requested`, else EVT_POOL_SIZE, else one thread per core.
    # @api private
    # @param requested [Integer, nil]
    # @return [Integer]
    # @raise [ArgumentError] not an Integer >= 0
    def self.pool_size(requested)
      size = requested
      if size.nil?
        from_env = ENV.fetch("EVT_POOL_SIZE", "")
        size = from_env.empty? ? Etc.nprocessors : (Integer(from_env, exception: false) || from_env)
      end
      raise ArgumentError, "evt: pool_size must be an Integer >= 0 (0: no pool), not #{size.inspect}" unless size.is_a?(Integer) && size >= 0

      size
    end

    # The hooks themselves: Evt::HOOKS (lib/evt/hook_table.rb) lists each, with where it lives.

    # Hook (Fiber.schedule): runs the block at once in a new non-blocking fiber, until it waits or
    # ends.
    #
    # An exception that ends the fiber goes where it would go without evt's help when the fiber was
    # scheduled by the thread's own, blocking code (as Ruby's reference scheduler has it): on to that
    # code, raised where it drives the loop (Fiber.schedule, #run, Fiber.set_scheduler(nil), the
    # thread's end), so a thread's fibers cannot fail unnoticed. A fiber scheduled by another
    # scheduled fiber is a child, as a connection handler is its server's: its exception is reported
    # on $stderr (as Thread#report_on_exception does) and ends that fiber only. SystemExit and
    # signals always go on to the loop.
    #
    # Fiber.schedule's keywords (storage:) come as one Hash, or none: no Hash is made for none.
    # @param options [Hash, nil] Fiber.new's keywords (`blocking: true` is refused)
    # @yield the fiber's body
    # @return [Fiber] the new fiber
    # @raise [ArgumentError] no block, or `blocking: true`
    def fiber(options = nil, &block)
      raise ArgumentError, "evt: Fiber.schedule needs a block" unless block
      raise ArgumentError, "wrong number of arguments (given 1, expected 0)" unless options.nil? || options.is_a?(Hash)
      raise ArgumentError, "evt: scheduled fibers are non-blocking" if options && options[:blocking]

      fiber = options ? Fiber.new(**options, blocking: false, &@fiber_body) : Fiber.new(&@fiber_body) # non-blocking
      @starting = block
      @starting_child = !Fiber.current.blocking?
      start_collecting(fiber)
    ensure
      @starting = nil # not kept alive by the scheduler, whether the fiber started or not
    end

    if RUBY_VERSION < "3.4"
      # Hook, Ruby 3.3 only: the loop's io_wait, raising IO::TimeoutError where the IO's own
      # #timeout ran out. Ruby 3.3 turns a false from io_wait into EAGAIN when a read or write
      # waited under the IO's own #timeout (3.4 raises IO::TimeoutError itself). Raise it here, as
      # Ruby does without a scheduler; the cost: IO#wait_readable with no argument raises too
      # instead of giving nil.
      # @return [Integer, false] the events that are ready, or false when a timeout given ran out
      # @raise [IO::TimeoutError] the IO's own #timeout ran out
      def io_wait(io, events, timeout)
        result = super
        if result == false && timeout.nil? && io.is_a?(IO) && io.timeout
          raise IO::TimeoutError, "Blocking operation timed out!"
        end

        result
      end
    end

    include ProcessWaiting

    # Hook (Process.wait): {ProcessWaiting#process_wait}, shown as a :process wait in {#fibers}.
    # @return [Process::Status, nil]
    def process_wait(pid, flags)
      doing(:process, pid) { super }
    end

    # Hook (Ruby 3.4+): Ruby asks here to run a C function that would block the thread without the
    # GVL (zlib, large IO::Buffer copies, big-integer division, file I/O): on the {BlockingPool}'s
    # threads, in parallel with the loop, while the calling fiber waits and the others run. With
    # pool_size 0, on this thread, as without a scheduler.
    # @param work [Proc, Fiber::Scheduler::BlockingOperation] called (or executed) once, on the
    #   thread that runs the operation; Ruby 4.0 hands a BlockingOperation
    # @return [Object] what Ruby expects of the hook; the operation's own result goes through its
    #   state
    def blocking_operation_wait(work)
      # Here, on this thread (blocking: else Ruby comes back here), without a pool; for the close(2)
      # of IO#close, which returns at once where a worker would cost two thread switches (the
      # IO#close wrappers set the flag); and inside a finalizer or a trap handler, which must not
      # switch fibers (a Tempfile's finalizer unlinks its file wherever the GC left the fiber).
      if @pool_size.zero? || Thread.current[:__evt_inline_offload] || trap_context?
        return Fiber.blocking { work.call }
      end

      pool = (@pool ||= BlockingPool.new(@pool_size))
      doing(:blocking, work) { pool.run(work) }
    end

    # Hook (Ruby 4.0+), which Ruby calls when a signal arrives while a fiber runs a blocking
    # operation, so that a scheduler holding signals back (as async does) gets to look at them; also
    # the method Async::Scheduler and Itsi::Scheduler give the code that drives a scheduler itself,
    # to let the other fibers run for a moment. Itsi's server (itsi-server, with `fiber_scheduler
    # "Evt::Scheduler"`) calls it from its request-pulling fiber whenever requests are still queued
    # after a batch: a scheduler without it ends that fiber with a NoMethodError, and the server
    # with it. As sleep(0): the ready fibers run and the loop looks at the kernel's events (without
    # waiting) before this fiber carries on.
    # @return [nil]
    def yield
      kernel_sleep(0)
    end

    # Hook (Timeout.timeout). Without a class of the caller's, the timeout library hands a scheduler
    # Timeout::Error itself, which the code inside the block may rescue: Net::HTTP rescues it as a
    # retryable error and sends its request again, outside the timeout's reach. Ruby without a
    # scheduler raises an internal Timeout::ExitException there, which no `rescue StandardError`
    # catches, and turns it into Timeout::Error only where the block ends; so does evt. (A caller
    # that names Timeout::Error itself gets the same, where Ruby would raise it inside the block:
    # the timeout library passes both alike.) Any other class is raised inside the block, as Ruby does.
    # @param duration [Numeric, nil] seconds
    # @param exception_class [Class, String] what to raise, with `arguments`
    # @yieldparam duration [Numeric, nil]
    # @return [Object] the block's value
    def timeout_after(duration, exception_class, *arguments, &block)
      return super unless exception_class.equal?(::Timeout::Error) && defined?(::Timeout::ExitException)

      exit = ::Timeout::ExitException.new(*arguments)
      begin
        super(duration, exit, &block)
      rescue ::Timeout::ExitException => e
        raise unless e.equal?(exit) # an outer timeout's: it ends where that one's block does

        raise exception_class.new(*arguments)
      end
    end

    # @return [Integer] the threads for blocking operations (0: none)
    attr_reader :pool_size

    # Hook (Addrinfo.getaddrinfo, TCPSocket.new, ...): resolves `hostname` on the {Resolver}'s
    # threads while the other fibers run.
    # @param hostname [String]
    # @return [Array<String>] addresses
    # @raise [Socket::ResolutionError] the name is unknown, as getaddrinfo would raise
    def address_resolve(hostname)
      resolver = (@resolver ||= Resolver.new)
      doing(:resolve, hostname) { resolver.resolve(hostname) }
    end

    # Hook (Ruby calls it when the thread ends or Fiber.set_scheduler replaces this scheduler): runs
    # every fiber to completion, releases the kernel objects and the resolver's and the worker
    # pool's threads. When Thread#kill is ending the thread, its fibers are ended instead (their
    # ensure clauses run), as Ruby ends a process's other threads: running them to completion could
    # wait forever.
    # @return [nil]
    def scheduler_close
      kill_all if Thread.current.status == "aborting"
      super
    ensure
      @stall_watch&.stop
      @profiler&.stop
      @resolver&.close
      @pool&.close
    end

    # Runs every fiber to completion and releases the kernel objects. As the thread's scheduler, it
    # is unset first (Ruby then calls {#scheduler_close}).
    # @return [nil]
    def close
      return Fiber.set_scheduler(nil) if Fiber.scheduler.equal?(self)

      scheduler_close
    end

    # Ends every fiber suspended in the loop, running their ensure clauses (Fiber#kill), as Ruby ends
    # a process's other threads. For a loop torn down by an exception ({Evt.run} calls it then).
    # @return [nil]
    def kill_all
      suspended_fibers.each { |fiber| fiber.kill if fiber.alive? }
      nil
    end

    private

    # Starts `fiber`; with no memory for its stack (FiberError), once more after a garbage collection:
    # CRuby gives the stack of a fiber that ended back only when the Fiber is collected, and fibers
    # switched to with transfer, as scheduled ones are, end without a resume that would give it
    # back at once. A fiber that did start (its own FiberError) is not started again.
    def start_collecting(fiber)
      collected = false
      begin
        start(fiber)
      rescue FiberError
        raise if collected || !fiber.alive?

        collected = true
        GC.start
        retry
      end
    end

    # What every scheduled fiber runs (see #fiber): its block, with its exception handled as #fiber says.
    def scheduled_fiber_body
      block = @starting # #fiber lets go of it once this fiber has started
      child = @starting_child
      started # the loop now knows this fiber runs (starting it could have failed)
      @fibers_started += 1
      begin
        block.call
      ensure
        @fibers_finished += 1
      end
    rescue SystemExit, SignalException
      raise
    rescue Exception => error # rubocop:disable Lint/RescueException -- a fiber's end, reported
      raise unless child

      report(error, block)
    end

    # Whether this code runs in a trap handler, or in a finalizer that a collection set off (those of
    # GC.start and of the exit are plain calls): Ruby refuses to lock a Mutex there (a Mutex of
    # evt's own, locked and let go at once: never contended), and no other check is open to Ruby code.
    def trap_context?
      (@trap_probe ||= Thread::Mutex.new).synchronize {}
      false
    rescue ThreadError
      true
    end

    # ProcessWaiting's wait for a pidfd.
    def wait_readable(io)
      io_wait(io, IO::READABLE, nil)
    end

    def report(error, block)
      return unless Thread.current.report_on_exception

      where = block.source_location&.join(":")
      $stderr.write("#<Fiber:#{Fiber.current.object_id} #{where}> terminated with exception " \
                    "(report_on_exception is true):\n#{error.full_message}")
    rescue StandardError
      nil
    end
  end

  # How a scheduler class picks its backend: shared by {Scheduler} and {SelectScheduler}, which
  # extend it (Evt::Scheduler.availables).
  module Choosing
    # The backends a scheduler can run on here.
    # @example
    #   Evt::Scheduler.availables # => [:io_uring, :epoll, :poll, :select] on a recent Linux
    # @return [Array<Symbol>] the backends that can run on this machine, fastest first (`select`
    #   is always there, and last of those the kernel has: the pure-Ruby loop has it where the C
    #   loop does not); an emulated one (kqueue through libkqueue on Linux) comes after it.
    def availables
      Loop.backends.select { |name| Loop.probe(name).nil? } | [:select]
    end

    private

    def choose_backend(requested)
      name = requested
      source = "backend"
      if name.nil?
        name = ENV.fetch("EVT_BACKEND", nil)
        name = nil if name&.empty?
        source = "EVT_BACKEND"
      end
      available = availables
      return available.first || raise(ArgumentError, "evt: no backend can run here") if name.nil?
      unless name.is_a?(Symbol) || name.is_a?(String)
        raise TypeError, "evt: backend must be a Symbol or String (nil: the fastest), not #{name.class}"
      end

      name = name.to_sym
      return name if available.include?(name)

      reason = Loop.backends.include?(name) ? "cannot run here (#{Loop.probe(name)})" : "is unknown"
      raise ArgumentError, "evt: #{source} #{name.inspect} #{reason}; available: #{available.map(&:inspect).join(", ")}"
    end
  end

  # A Fiber Scheduler: `Fiber.set_scheduler(Evt::Scheduler.new)` makes every blocking operation in a
  # non-blocking fiber of this thread wait in the event loop, while the other fibers run. {Evt.run}
  # is the short form. A scheduler belongs to the thread that uses it.
  #
  # Options of {Scheduler.new}, both with a default from the environment:
  # - `backend:` the event mechanism, :io_uring, :epoll, :kqueue, :poll or :select; default EVT_BACKEND, else
  #   the fastest that runs here ({Choosing#availables Scheduler.availables} lists them, fastest
  #   first; {Loop#backend #backend} names the one in use);
  # - `pool_size:` threads for the blocking operations Ruby 3.4+ hands to the scheduler (zlib, large
  #   IO::Buffer copies); default EVT_POOL_SIZE, else one per core; 0 runs them on the loop's
  #   thread.
  #
  # The hooks Ruby calls on the hot path live in C, in {Evt::Loop} (ext/evt/io.c, hooks.c); the
  # pure-Ruby loop has them in Ruby ({SelectLoop}). The hooks written in Ruby for every loop are in
  # {Scheduling}. {Evt::HOOKS} lists every hook once, with where it lives (docs/hooks.md shows it
  # as a table).
  #
  # The `select` backend is select(2) in the C loop where the extension has it (Linux builds); where
  # the extension is not loaded, Evt::Loop is the pure-Ruby loop ({SelectLoop}) and Evt::Scheduler
  # runs on it; {SelectScheduler} offers that loop on request.
  #
  # @example The standard interface
  #   Fiber.set_scheduler(Evt::Scheduler.new)
  #   Fiber.schedule { sleep 0.2 }
  #   Fiber.schedule { sleep 0.2 }
  #   Fiber.set_scheduler(nil) # runs the loop until both fibers are done: 0.2 s, not 0.4
  # @example Options
  #   scheduler = Evt::Scheduler.new(backend: :epoll, pool_size: 2)
  #   scheduler.backend   # => :epoll
  #   scheduler.pool_size # => 2
  # @example A backend that cannot run on this machine (a Linux one, without libkqueue)
  #   Evt::Scheduler.new(backend: :iocp)
  #   # ArgumentError: evt: backend :iocp is unknown; available: :io_uring, :epoll, :poll, :select
  class Scheduler < Loop
    prepend Scheduling
    extend Choosing

    # A new scheduler (see {#initialize} for the options).
    # @overload new(backend: nil, pool_size: nil)
    #   @param backend [Symbol, String, nil] see {#initialize}
    #   @param pool_size [Integer, nil] see {#initialize}
    #   @return [Scheduler, SelectScheduler] a {SelectScheduler} for the select backend where the C
    #     extension is loaded but has no select backend of its own (not Linux).
    #   @raise [ArgumentError] a subclass asked for the select backend there (subclass
    #     {SelectScheduler} for that).
    def self.new(*arguments, **options, &block)
      if Evt.extension? && !Loop.backends.include?(:select) && choose_backend(options[:backend]) == :select
        unless equal?(Scheduler)
          raise ArgumentError, "evt: #{self} runs on the C loop, which has no select backend on this platform; " \
                               "for the pure-Ruby one, subclass Evt::SelectScheduler"
        end

        return SelectScheduler.new(*arguments, **options, &block)
      end
      super
    end

    # A scheduler on a loop of its own, for the current thread; the loop's kernel objects are opened
    # now, the pool's and the resolver's threads when first needed.
    # @overload initialize(backend: nil, pool_size: nil)
    #   @param backend [Symbol, String, nil] the event mechanism: one of
    #     {Choosing#availables availables}. nil takes EVT_BACKEND from the environment if set, else
    #     the fastest available.
    #   @param pool_size [Integer, nil] threads for blocking operations (taken by
    #     {Scheduling#initialize}); 0: none, nil: EVT_POOL_SIZE if set, else one per core
    #   @raise [ArgumentError] the backend is unknown or cannot run here, or pool_size is not an
    #     Integer >= 0.
    #   @raise [TypeError] backend is not a Symbol, String or nil.
    def initialize(backend: nil)
      super(self.class.send(:choose_backend, backend))
    end
  end

  autoload :SelectScheduler, File.expand_path("select_scheduler", __dir__)
end
