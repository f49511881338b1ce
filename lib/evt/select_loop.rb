# frozen_string_literal: true

require "rbconfig"

begin
  require "io/nonblock"
rescue LoadError
  nil # no IO#nonblock? here: every descriptor counts as non-blocking
end
begin
  require "fcntl" # now: loading it in IO#close_read would read files through the scheduler
rescue LoadError
  nil # no fcntl here: IO#close_read and #close_write guess (see SelectLoop.closes_for?)
end

module Evt
  # The `select` backend: the whole event loop in pure Ruby on IO.select, for platforms where the C
  # extension cannot be built or loaded (no compiler, JRuby, TruffleRuby, Windows), and on request
  # (`backend: :select`) everywhere else. A module: {SelectScheduler} (an Evt::Scheduler) includes
  # it where the extension is loaded, and Evt::Loop itself where it is not.
  #
  # It follows the C core (ext/evt/loop.c and the files loop.h lists) step by step, with Ruby
  # objects where the C core has structs: a {Waiter} per suspension, a {Timers} heap, a hash of the
  # IOs waited on, a self-pipe for wakeups from other threads. One loop iteration: serve the other threads' requests, resume the ready
  # fibers, wait in IO.select (without the GVL) for every watched IO and the wakeup pipe, mark the
  # waiters whose IOs are ready, fire the due timers.
  #
  # io_read and io_write are here too: without them Ruby 3.4 waits for a descriptor inside its own
  # blocking region (io.c's nogvl_wait_for calls io_wait there), where an IO#close from another
  # fiber of the thread finds the waiter registered and breaks. io_pread and io_pwrite only from
  # Ruby 4.0, which calls io_pwrite with the GVL (ruby/ruby#15428): 3.3 and 3.4 call it without, where
  # no Ruby code may run (positioned transfers are on files, which never wait, and Ruby does them
  # itself there). As in ext/evt/io.c, every transfer is one primitive
  # (#transfer_single), under both conventions of the hooks: Ruby 3.3 to 4.0's (at least `length`
  # bytes) and Ruby 4.1's (one transfer, or -EAGAIN); io_read and io_write are this Ruby's, and the
  # private *_minimum and *_single methods, io_pread and io_pwrite's too, reach both on any Ruby.
  # Processes are waited for on a thread. Every wait allocates a few objects.
  module SelectLoop
    BACKENDS = [:select].freeze

    # This Ruby's scheduler interface (RUBY_FIBER_SCHEDULER_VERSION, which the C loop binds at compile
    # time and Ruby code cannot see): from the header Ruby installed, where there is one; else 4 from
    # Ruby 4.1, the first with interface 4 (a 4.1 development build may still have 3).
    INTERFACE = begin
      header = File.join(RbConfig::CONFIG["rubyhdrdir"], "ruby", "fiber", "scheduler.h")
      Integer(File.read(header)[/^#define RUBY_FIBER_SCHEDULER_VERSION (\d+)/, 1])
    rescue StandardError
      RUBY_VERSION >= "4.1" ? 4 : 3
    end
    EVENTS = IO::READABLE | IO::PRIORITY | IO::WRITABLE
    FOREVER = 2**61 # nanoseconds: longer timeouts are this one (73 years), as in C

    # What a finished wait reports besides events (> 0) and "unblocked" (1), as in loop.h.
    SPURIOUS = 0
    TIMED_OUT = -1
    CLOSED = -2

    # @return [Array<Symbol>] the backends of this loop: [:select]
    def self.backends
      BACKENDS
    end

    # @return [String, nil] nil when +name+ can run here, else why not
    def self.probe(name)
      BACKENDS.include?(backend_name(name)) ? nil : "unknown backend"
    end

    def self.backend_name(name)
      unless name.is_a?(Symbol) || name.is_a?(String)
        raise TypeError, "evt: backend name must be a Symbol or String, not #{name.class}"
      end

      name.to_sym
    end
    private_class_method :backend_name

    # One suspension of one fiber: what it waits for and how it ended. A new one per suspension,
    # so a stale reference (in the ready queue, a timer, a request) can never wake a later wait.
    class Waiter
      attr_reader :fiber
      attr_accessor :state, :result, :timer, :unblockable, :switcher

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

      def watch(io, events)
        if @io.nil? && @watches.nil?
          @io = io
          @events = events
        else
          @watches ||= [[@io, @events]]
          @watches << [io, events]
        end
      end

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

    # A timeout_after in progress: raises +exception+ in +fiber+ when its timer fires.
    Timeout = Struct.new(:fiber, :exception)

    # The timer heap, as ext/evt/timers.c has it: a binary min-heap on [deadline, sequence] whose
    # timers know their index in it, so a timer leaves at once, by its index, with no search and
    # nothing left behind to skip later. Equal deadlines fire in the order they were added.
    class Timers
      # +index+: the timer's position in the heap, nil when it is not in it.
      Timer = Struct.new(:deadline, :sequence, :target, :index)

      def initialize
        @heap = []
        @sequence = 0 # not reset by #clear, as in C: only its order matters
      end

      def add(deadline, target)
        timer = Timer.new(deadline, @sequence, target, nil)
        @sequence += 1
        place(@heap.size, timer)
        sift_up(timer.index)
        timer
      end

      # Takes +timer+ out of the heap; nothing when it is not in it (it fired, or left already). The
      # last timer takes its place and moves up or down from there.
      def remove(timer)
        index = timer.index or return
        timer.index = nil
        last = @heap.pop
        return if index == @heap.size

        place(index, last)
        if index.positive? && earlier?(last, @heap[(index - 1) / 2]) then sift_up(index)
        else sift_down(index)
        end
      end

      # The earliest timer, or nil.
      def first
        @heap.first
      end

      def each(&block)
        @heap.each(&block)
      end

      def size
        @heap.size
      end

      def clear
        @heap.each { |timer| timer.index = nil }
        @heap.clear
      end

      private

      def earlier?(a, b)
        a.deadline < b.deadline || (a.deadline == b.deadline && a.sequence < b.sequence)
      end

      def place(index, timer)
        @heap[index] = timer
        timer.index = index
      end

      # Moves the timer at +index+ up until its parent is earlier, shifting the parents down.
      def sift_up(index)
        timer = @heap[index]
        while index.positive?
          parent = (index - 1) / 2
          break unless earlier?(timer, @heap[parent])

          place(index, @heap[parent])
          index = parent
        end
        place(index, timer)
      end

      # Moves the timer at +index+ down until no child is earlier, shifting the earlier child up.
      def sift_down(index)
        timer = @heap[index]
        size = @heap.size
        while (child = (2 * index) + 1) < size
          child += 1 if child + 1 < size && earlier?(@heap[child + 1], @heap[child])
          break unless earlier?(@heap[child], timer)

          place(index, @heap[child])
          index = child
        end
        place(index, timer)
      end
    end

    @forks = 0

    class << self
      # Counts forks, so a loop can tell it was inherited (see {ForkWatch}).
      attr_reader :forks

      def forked
        @forks += 1
      end

      # Every select loop of this Ractor, for IO#close to look through; weakly held. (Another
      # Ractor's loops cannot know this one's IOs, and may not be touched from here.)
      def loops
        Ractor.current[:evt_select_loops] ||= ObjectSpace::WeakMap.new
      end

      # IO#close (and close_read, close_write) of +io+, from any thread, before the descriptor
      # closes (see evt_close_io in close.c): the waiters on that IO object, in every select loop
      # that knows it, raise IOError. The block, if given, says whether the call closes the
      # descriptor at all; it is asked only when a loop knows +io+ (it may cost system calls).
      #
      # Ruby 4.0 interrupts the waiting fibers itself through the closing thread's scheduler,
      # unless the closer is a blocking fiber (its wait for them would block the thread for ever:
      # that scheduler's woken fibers run first here) or the thread has none; other threads' loops
      # hear of it as on 3.x (a wait begun there while the close flushes).
      def closing(io)
        closes = nil
        scheduler = Fiber.scheduler
        own = own_loops(scheduler)
        yield_to = nil
        loops.each_key do |loop|
          next unless loop.__send__(:knows?, io)
          next if loop.__send__(:owned_here?) && own == :none

          closes = !block_given? || yield if closes.nil?
          next unless closes

          if own == :wake_run && loop.__send__(:owned_here?)
            next unless loop.equal?(scheduler) && loop.__send__(:can_yield?)

            loop.__send__(:close_io, io, elsewhere: true)
            yield_to = loop
          else
            loop.__send__(:io_closing, io)
          end
        end
        yield_to&.kernel_sleep(0) # the woken fibers leave their waits before Ruby's close waits for them
      end

      # What the closing thread's own loops do (see close.c's enum own_loops).
      def own_loops(scheduler)
        return :wake if RUBY_VERSION < "4" || scheduler.nil?

        Fiber.current_scheduler ? :none : :wake_run
      end

      # Once +io+ is closed, the loops that still know it hear of it again: a fiber may have begun
      # to wait on it during the close (while it flushed), or Ruby closed it where close.c's
      # conditions say it does not (IO#close_read of a socket already shut down for writing closes
      # it). IO.select does not notice a descriptor closed under it. (BasicSocket's own close_read
      # and close_write never come here: the loop finds their IO closed on its next turn.)
      def closed(io)
        return unless io.closed?

        loops.each_key { |loop| loop.__send__(:io_closing, io) if loop.__send__(:knows?, io) }
      end

      # The IO that IO.popen's "r+" IO writes through, while it is open: Ruby keeps it in an
      # instance variable (close.c reads rb_io_t's tied_io_for_writing).
      def write_io(io)
        tied = io.instance_variable_get(:@tied_io_for_writing)
        tied unless tied.nil? || tied.closed?
      end

      # Whether close_read (+direction+ :read) or close_write (:write) of +io+ closes its descriptor,
      # as close.c decides: not for a socket (shut down instead, which its waiters see as end of
      # file or an error), nor for an IO open for the other direction only (IOError). Ruby's own
      # mode for the IO is not visible from Ruby: the descriptor's access mode stands in for it,
      # the same but for an IO.new narrower than its descriptor; unknown (no fcntl), it closes.
      def closes_for?(io, direction)
        return false if socket?(io)

        mode = access_mode(io)
        mode.nil? || mode != (direction == :read ? File::WRONLY : File::RDONLY)
      end

      private

      # As close.c's is_socket: fstat, so an IO.for_fd of a socket is one too. Blocking, as in C:
      # Ruby 3.4 would hand it to blocking_operation_wait, on another thread, and the closer would
      # wait for it while the fibers it has yet to tell go on.
      def socket?(io)
        Fiber.blocking { io.stat.socket? }
      rescue StandardError
        defined?(BasicSocket) ? io.is_a?(BasicSocket) : false
      end

      def access_mode(io)
        return unless defined?(Fcntl::O_ACCMODE)

        Fiber.blocking { io.fcntl(Fcntl::F_GETFL) } & Fcntl::O_ACCMODE # blocking: see #socket?
      rescue StandardError, NotImplementedError
        nil
      end

      public

      # Prepends {CloseWatch} and {ReadNonblockWatch} to IO, once: only processes that use a
      # select loop pay for them.
      def watch_closes
        return if IO.include?(ReadNonblockWatch)

        IO.prepend(CloseWatch, ReadNonblockWatch)
      end
    end

    # Process._fork, which every fork of Ruby goes through (Process.daemon aside): the child counts it.
    module ForkWatch
      def _fork
        pid = super
        SelectLoop.forked if pid.zero?
        pid
      end

      # Forks in C, without _fork; returns in the child only.
      def daemon(...)
        result = super(...)
        SelectLoop.forked
        result
      end
    end
    Process.singleton_class.prepend(ForkWatch)

    # Prepended to IO once the first select loop exists: Ruby 3.3 and 3.4 call no scheduler hook on
    # close. As ext/evt/close.c does for the C loop, and on the same conditions, the waiters are
    # told before the descriptor closes: a close may wait itself (flushing a buffered write to a full
    # pipe), and the fibers waiting on the IO must not go on meanwhile as if it were still open.
    module CloseWatch
      # The waiters on this IO, and on the IO its writes go to (IO.popen's "r+"), first.
      def close
        unless closed?
          SelectLoop.closing(self)
          write_io = SelectLoop.write_io(self)
          SelectLoop.closing(write_io) if write_io
        end
        Thread.current[:__evt_inline_offload] = true # close(2) runs here (Scheduling#blocking_operation_wait)
        super
      ensure
        Thread.current[:__evt_inline_offload] = nil
        SelectLoop.closed(self)
        SelectLoop.closed(write_io) if write_io
      end

      # Closes the descriptor unless it is a socket (shut down instead, which wakes the readers with
      # end of file) or an IO only for writing (IOError).
      def close_read
        SelectLoop.closing(self) { SelectLoop.closes_for?(self, :read) } unless closed?
        super
      ensure
        SelectLoop.closed(self)
      end

      # The same for the IO writes go to.
      def close_write
        write_io = SelectLoop.write_io(self) || self
        SelectLoop.closing(write_io) { SelectLoop.closes_for?(write_io, :write) } unless write_io.closed?
        super
      ensure
        SelectLoop.closed(write_io) if write_io
      end
    end

    # Ruby sends read_nonblock and sysread to io_read with the same arguments, yet only the first
    # must not wait: this tells io_read, through a fiber-local flag. (The C hooks ask
    # rb_profile_frames; caller_locations would cost a microsecond per read.)
    module ReadNonblockWatch
      def read_nonblock(...)
        Thread.current[:__evt_read_nonblock] = true
        super(...)
      ensure
        Thread.current[:__evt_read_nonblock] = nil
      end
    end

    # @param name [Symbol, String] :select
    # @raise [ArgumentError] any other name
    def initialize(name)
      raise "evt: loop already initialized" if @backend

      name = SelectLoop.__send__(:backend_name, name)
      raise ArgumentError, "evt: unknown backend #{name.inspect}" unless BACKENDS.include?(name)

      @backend = name
      @loop_fiber = @current = Fiber.current
      @thread = Thread.current
      @forks = SelectLoop.forks
      @ready = []
      @timers = Timers.new
      @watched = {}.compare_by_identity # io => {waiter => events}
      @closing = {}.compare_by_identity # io => true: another thread closes it (see #close_io)
      @blocking_modes = ObjectSpace::WeakMap.new # io => whether its descriptor is in blocking mode
      @resumes = nil # fiber => how often the loop resumed it, once another thread unblocks
      @unblockable = {}.compare_by_identity # fiber => waiter
      @early_unblock = nil # an unblock for the fiber running now, before it blocked (see #unblock)
      @requests = Thread::Queue.new # from other threads: [kind, subject, argument]
      @waiting = 0
      @running = 0
      @blocked = false
      @wakeup_r = @wakeup_w = nil
      SelectLoop.watch_closes
      SelectLoop.loops[self] = true
      open_backend
    end

    # @return [Symbol] :select
    def backend
      check
      @backend
    end

    # @return [Boolean] whether the wakeup pipe is closed (a later use opens it again)
    def closed?
      check
      @wakeup_r.nil?
    end

    # @return [Integer] the number of fibers suspended in the loop
    def waiting
      check
      @waiting
    end

    # ---- hooks ------------------------------------------------------------------------------------

    # Waits until +io+ has one of +events+; nil +timeout+ means the IO's own #timeout.
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
      # Reads into the IO::Buffer at +offset+ once, at most +length+ bytes; never waits.
      # @return [Integer] bytes read (0: end of file), or -errno (-EAGAIN: nothing ready)
      def io_read(io, buffer, offset, length)
        io_read_single(io, buffer, offset, length)
      end

      # Writes from the IO::Buffer at +offset+ once, at most +length+ bytes; never waits.
      # @return [Integer] bytes written, or -errno (-EAGAIN: no room)
      def io_write(io, buffer, offset, length)
        io_write_single(io, buffer, offset, length)
      end

      # As io_read, at file position +from+ (which does not move).
      def io_pread(io, buffer, from, offset, length)
        io_pread_single(io, buffer, from, offset, length)
      end

      # As io_write, at file position +from+ (which does not move).
      def io_pwrite(io, buffer, from, offset, length)
        io_pwrite_single(io, buffer, from, offset, length)
      end
    else
      # Reads into the IO::Buffer at +offset+: at least +length+ bytes, end of file or an error
      # (+length+ 0: whatever one read gives; -EAGAIN only for read_nonblock, which must not wait).
      # @return [Integer] bytes read, or -errno
      def io_read(io, buffer, length, offset)
        io_read_minimum(io, buffer, length, offset)
      end

      # Writes from the IO::Buffer at +offset+: at least +length+ bytes or an error.
      # @return [Integer] bytes written, or -errno
      def io_write(io, buffer, length, offset)
        io_write_minimum(io, buffer, length, offset)
      end

      if RUBY_VERSION >= "4"
        # As io_read, at file position +from+ (which does not move); -ESPIPE for a pipe or socket.
        def io_pread(io, buffer, from, length, offset)
          io_pread_minimum(io, buffer, from, length, offset)
        end

        # As io_write, at file position +from+ (which does not move).
        def io_pwrite(io, buffer, from, length, offset)
          io_pwrite_minimum(io, buffer, from, length, offset)
        end
      end
    end

    # IO.select: every IO watched by the loop at once. Bad input raises what IO.select raises.
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

    # Sleeps +duration+ seconds, or until #unblock (nil: no limit); sleep(0) lets the other ready
    # fibers run first.
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

    # Blocks the current fiber until #unblock (true) or +timeout+ seconds (false).
    def block(_blocker, timeout = nil)
      timeout = interval(timeout, saturate: true)
      get
      block_fiber(timeout)
    end

    # Wakes +fiber+ from #block or #kernel_sleep. Safe from any thread: another thread's request
    # goes through the queue and the wakeup pipe.
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

    # Timeout.timeout: raises exception_class.new(*arguments) in the fiber if the block still runs
    # after +duration+ seconds. A negative duration has expired already.
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

    # Ruby 4.0: closes descriptor +fd+ (its waiters were interrupted already).
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
    STAND_IN_METHODS = %i[alive? raise transfer].freeze

    # Ruby 4.0: raises +exception+ in +fiber+, which waits in this loop. From any thread: the loop
    # raises it on its next turn. +fiber+ is a Fiber, or, as scheduler interface 5 allows
    # (ruby/ruby#18793), any object that answers alive?, raise and transfer (a wrapper around one).
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
    def wakeup
      check
      signal if @blocked
      nil
    end

    private

    # ---- the loop object --------------------------------------------------------------------------

    # The loop, after any fork.
    # The loop, after any fork. Only the child's main thread (the one that forked) starts it over:
    # a thread started in the child may call #unblock before that thread used the loop again.
    def check
      raise "evt: the scheduler is not initialized" unless @backend

      after_fork if @forks != SelectLoop.forks && Thread.current == Thread.main
      self
    end

    # The loop, for its own thread: an idle one moves to the thread that uses it next.
    def owned
      check
      thread = Thread.current
      if thread != @thread
        if @waiting.positive? || @running.positive?
          raise ThreadError, "evt: this scheduler belongs to another thread, where fibers wait in it"
        end

        @thread = thread
        @loop_fiber = @current = Fiber.current
        @launcher = nil # a fiber belongs to its thread
      end
      self
    end

    # The loop, ready for its thread: a closed one opens again.
    def get
      owned
      open_backend unless @wakeup_r
      self
    end

    def open_backend
      @wakeup_r, @wakeup_w = IO.pipe
    end

    def close_pipe
      @wakeup_r&.close unless @wakeup_r&.closed?
      @wakeup_w&.close unless @wakeup_w&.closed?
      @wakeup_r = @wakeup_w = nil
    end

    def close_backend
      owned
      raise FiberError, "evt: the loop is running: it closes when it is done" if @running.positive?

      close_pipe
      nil
    end

    # In a forked child: the pipe is the parent's, and so are the fibers waiting here; the forking
    # fiber now drives the loop (see loop_after_fork in object.c). Requests stay: those the parent's
    # threads made are dropped when served, those of the child's threads are the child's.
    def after_fork
      @forks = SelectLoop.forks
      # Dropped, not closed: Ruby 3.4's IO#close in a child can wait for users of the descriptor
      # the child inherited from its parent's threads (seen here with the worker pool's threads
      # starting before the loop did), and the GC's finalizer closes it without waiting.
      @wakeup_r = @wakeup_w = nil
      @ready = []
      @timers.clear
      @watched.clear
      @closing.clear
      @unblockable.clear
      @early_unblock = nil
      @waiting = 0
      @running = 0
      @blocked = false
      @loop_fiber = @current = Fiber.current
      @thread = Thread.current
      @launcher = nil # another thread's perhaps, which the child has not
    end

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    end

    # nil -> nil (no limit); otherwise nanoseconds, with the errors Kernel#sleep gives.
    # Past Time's range (2**63 seconds), +saturate+ gives FOREVER (Queue#pop(timeout:) waits any
    # time without a scheduler), else RangeError (as sleep and IO.select raise).
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

    def make_exception(exception_class, arguments)
      unless exception_class.respond_to?(:exception)
        raise TypeError, "exception class/object expected" unless exception_class.is_a?(String) && arguments.empty?

        return RuntimeError.new(exception_class)
      end
      exception = exception_class.exception(*arguments)
      raise TypeError, "exception object expected" unless exception.is_a?(Exception)

      exception
    end

    # The block's value, or the exception of +classes+ it raised. On Ruby 3.3 and 3.4, $! holds the
    # exception that is ending the thread while scheduler_close runs, and a rescue (like a `break`
    # out of a block) on this fiber would clear it; then the rescue happens on a fiber of its own.
    def rescuing(*classes)
      unless $!
        begin
          return yield
        rescue *classes => e
          return e
        end
      end
      Fiber.new(blocking: true) do
        yield
      rescue *classes => e
        e
      end.resume
    end

    # ---- readiness without waiting ----------------------------------------------------------------

    # IO.select from a blocking context, so it does not come back here as io_select.
    def select_now(readables, writables, exceptables)
      Fiber.blocking { IO.select(readables, writables, exceptables, 0) }
    end

    def ready_now(io, events)
      result = select_now(events.anybits?(IO::READABLE) ? [io] : nil, events.anybits?(IO::WRITABLE) ? [io] : nil,
                          events.anybits?(IO::PRIORITY) ? [io] : nil)
      return 0 unless result

      (result[0].empty? ? 0 : IO::READABLE) | (result[1].empty? ? 0 : IO::WRITABLE) |
        (result[2].empty? ? 0 : IO::PRIORITY)
    end

    # ---- transfers --------------------------------------------------------------------------------

    EAGAIN = -Errno::EAGAIN::Errno
    EINTR = -Errno::EINTR::Errno
    EINVAL = -Errno::EINVAL::Errno
    PIPE_BUF = 512 # POSIX's least: a writable pipe in blocking mode takes this much without blocking

    # Both conventions of the transfer hooks, whichever this Ruby calls (see io.c): the public io_read
    # and io_write are one or the other, and tests reach both on any Ruby. Positioned transfers at a
    # negative +from+ are -EINVAL, as pread(2) says (Ruby names the file).

    # Ruby 4.1's io_read: one read into +buffer+ at +offset+ of at most +length+ bytes.
    # @return [Integer] bytes read (0: end of file), or -errno: -EAGAIN when nothing is ready (Ruby
    #   then calls io_wait), -EINVAL when the range is not inside the buffer
    def io_read_single(io, buffer, offset, length)
      transfer_single_hook(io, buffer, offset, length, nil, IO::READABLE)
    end

    # Ruby 4.1's io_write: one write from +buffer+ at +offset+ of at most +length+ bytes.
    # @return [Integer] bytes written, or -errno, as io_read_single
    def io_write_single(io, buffer, offset, length)
      transfer_single_hook(io, buffer, offset, length, nil, IO::WRITABLE)
    end

    # Ruby 4.1's io_pread: as io_read_single, at file position +from+ (which does not move).
    def io_pread_single(io, buffer, from, offset, length)
      return EINVAL if from.negative?

      transfer_single_hook(io, buffer, offset, length, from, IO::READABLE)
    end

    # Ruby 4.1's io_pwrite: as io_write_single, at file position +from+ (which does not move).
    def io_pwrite_single(io, buffer, from, offset, length)
      return EINVAL if from.negative?

      transfer_single_hook(io, buffer, offset, length, from, IO::WRITABLE)
    end

    # Ruby 3.3 to 4.0's io_read: reads into +buffer+ from +offset+ at least +length+ bytes, end of
    # file or an error (+length+ 0: whatever one read gives; -EAGAIN only for read_nonblock, which
    # must not wait).
    # @return [Integer] bytes read, or -errno
    def io_read_minimum(io, buffer, length, offset)
      transfer_minimum(io, buffer, length, offset, nil, IO::READABLE)
    end

    # Ruby 3.3 to 4.0's io_write: writes from +buffer+ at +offset+ at least +length+ bytes or an
    # error (+length+ 0: whatever one write takes).
    # @return [Integer] bytes written, or -errno
    def io_write_minimum(io, buffer, length, offset)
      transfer_minimum(io, buffer, length, offset, nil, IO::WRITABLE)
    end

    # Ruby 3.3 to 4.0's io_pread: as io_read_minimum, at file position +from+ (which does not move).
    # -ESPIPE for a pipe or socket, as pread(2) says.
    def io_pread_minimum(io, buffer, from, length, offset)
      return EINVAL if from.negative?

      transfer_minimum(io, buffer, length, offset, from, IO::READABLE)
    end

    # Ruby 3.3 to 4.0's io_pwrite: as io_write_minimum, at file position +from+ (the hook on 4.0
    # only: 3.3 and 3.4 call io_pwrite without the GVL, where no Ruby code may run).
    def io_pwrite_minimum(io, buffer, from, length, offset)
      return EINVAL if from.negative?

      transfer_minimum(io, buffer, length, offset, from, IO::WRITABLE)
    end

    # One transfer of at most +length+ bytes (see transfer_single_hook in io.c). Nothing to move is
    # no system call, once the range is known to be inside the buffer.
    def transfer_single_hook(io, buffer, offset, length, position, events)
      get
      io.fileno # IOError for a closed stream
      return inside?(buffer.size, offset, 0) ? 0 : EINVAL if length.zero?

      blocking = blocking_mode?(io)
      while true # rubocop:disable Style/InfiniteLoop
        result = transfer_single(io, buffer, offset, length, position, events, blocking)
        return result unless result == EINTR
      end
    end

    # Transfers until at least +length+ bytes (0: one successful transfer), end of file or an error,
    # waiting in the loop on EAGAIN (see transfer_minimum_hook in io.c).
    def transfer_minimum(io, buffer, length, offset, position, events)
      get
      io.fileno # IOError for a closed stream
      blocking = blocking_mode?(io)
      if length.zero? && position.nil?
        # Only read_nonblock must not wait; every other reader and writer waits, here or after.
        length = 1 unless events == IO::READABLE && called_by_read_nonblock?
      end
      total = 0
      while true # rubocop:disable Style/InfiniteLoop
        result = transfer_single(io, buffer, offset + total, nil, position && (position + total), events, blocking)
        if result.positive?
          total += result
          break if total >= length

          next
        end
        break if result.zero? # end of file, or a full buffer
        next if result == EINTR
        if result == EAGAIN
          return total.positive? ? total : EAGAIN if total >= length

          wait_for_transfer(io, events)
          next
        end
        break if total.positive? # the error shows on the next call

        return result
      end
      total
    end

    # While Ruby's own transfer runs: no asynchronous exception (see #transfer_single).
    UNINTERRUPTED = { Exception => :never }.freeze

    # The primitive every transfer is made of: one read(2) or write(2) (pread, pwrite at +position+
    # unless it is nil) between the buffer at +offset+ and +io+, of at most +max+ bytes, or up to the
    # end of the buffer when +max+ is nil. Never waits: a descriptor in blocking mode is polled first,
    # and written at most PIPE_BUF bytes at a time.
    # @return [Integer] bytes moved (0: end of file), or -errno: -EAGAIN when the descriptor is not
    #   ready, -EINTR to try again, -EINVAL when the range is not inside the buffer
    #
    # Ruby's own transfer runs it, from a blocking fiber: Fiber.scheduler is nil there, so IO::Buffer
    # does the system call itself instead of calling these hooks again.
    #
    # Asynchronous exceptions wait until the transfer is over. An IO#close in another thread finds
    # this one in Ruby's transfer, queues "stream closed in another thread" for it, and waits for it
    # to leave; when the closer is a scheduled fiber, this thread runs the closer's scheduler's
    # #unblock on its way out, with the exception still pending (Ruby 3.3, 3.4), and raised in the
    # middle of that hook the exception would lose the wakeup (and leave Ruby's mutex locked): the
    # closer would wait forever. Masked, it is raised once the transfer returns, here.
    def transfer_single(io, buffer, offset, max, position, events, blocking)
      size = buffer.size # asked before every try: another fiber may have resized the buffer meanwhile
      if max.nil?
        raise ArgumentError, "offset #{offset} is past the end of the buffer (#{size} bytes)" if offset > size

        max = size - offset
      elsif !inside?(size, offset, max)
        return EINVAL
      end
      if blocking
        return EAGAIN if ready_now(io, events).zero?

        max = PIPE_BUF if events == IO::WRITABLE && max > PIPE_BUF
      end
      unless max == size - offset
        # IO::Buffer transfers up to the end of the buffer: a slice ends where this transfer does.
        buffer = buffer.slice(offset, max)
        offset = 0
      end
      Fiber.blocking do
        Thread.handle_interrupt(UNINTERRUPTED) do
          if position.nil?
            events == IO::READABLE ? buffer.read(io, 0, offset) : buffer.write(io, 0, offset)
          else
            events == IO::READABLE ? buffer.pread(io, position, 0, offset) : buffer.pwrite(io, position, 0, offset)
          end
        end
      end
    end

    # Whether +length+ bytes at +offset+ are inside a buffer of +size+ bytes.
    def inside?(size, offset, length)
      !offset.negative? && !length.negative? && offset <= size && length <= size - offset
    end

    # Waits as a read or write would, under the IO's own #timeout.
    def wait_for_transfer(io, events)
      timeout = io.is_a?(IO) ? interval(io.timeout) : nil
      raise IO::TimeoutError, "Blocking operation timed out!" if wait_io(io, events, timeout) == TIMED_OUT

      io.fileno # closed meanwhile: raise rather than transfer on a number another file may have now
    end

    # Whether read_nonblock called io_read: sysread comes with the same arguments and must wait
    # ({ReadNonblockWatch} says so, for this fiber).
    def called_by_read_nonblock?
      Thread.current[:__evt_read_nonblock] || false
    end

    # Whether +io+'s descriptor is in blocking mode (a FIFO, a tty, a pipe after `nonblock =
    # false`), so a transfer must look first. Learnt once per IO object, as the C hooks do (an
    # fcntl per transfer would cost more). Regular files and block devices never wait.
    def blocking_mode?(io)
      blocking = @blocking_modes[io]
      return blocking unless blocking.nil?

      blocking = descriptor_blocking?(io)
      blocking &&= !(stat = io.stat).file? && !stat.blockdev?
      @blocking_modes[io] = blocking
    end

    # io/nonblock's IO#nonblock? (no system call that lets go of the GVL, which IO#fcntl is) where
    # it may be called: not outside the main Ractor in Ruby 3.3 (Ractor::UnsafeError), where
    # O_NONBLOCK is read with IO#fcntl instead.
    def descriptor_blocking?(io)
      @fcntl_for_nonblock = RUBY_VERSION < "3.4" && Ractor.current != Ractor.main if @fcntl_for_nonblock.nil?
      if @fcntl_for_nonblock && defined?(Fcntl::O_NONBLOCK)
        return (Fiber.blocking { io.fcntl(Fcntl::F_GETFL) } & Fcntl::O_NONBLOCK).zero?
      end

      io.respond_to?(:nonblock?) && !io.nonblock?
    end

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

    # Suspends the current fiber on +waiter+ until the loop resumes it. However the fiber is
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
        when :yield, :start
          wake(waiter, SPURIOUS)
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

    # Raises +exception+ in +fiber+ from the loop fiber: a switch to it, as #switch_to's, so @current
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

    # Raises +exception+ through a stand-in for a fiber (fiber_interrupt): its raise switches to the
    # fiber inside, which the loop cannot name. @current is nil meanwhile, so that fiber's unwinding
    # readies no one (see #ready_the_switcher and interrupt_fiber in loop.c).
    def raise_through(stand_in, exception)
      @current = nil
      stand_in.raise(exception)
    ensure
      @current = @loop_fiber
    end

    # Starts +fiber+ from the loop fiber through a non-blocking launcher fiber, which makes the first
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

    # Resumes the fibers that were ready when it started; true when +until_waiter+ came up.
    def resume_ready(until_waiter)
      count = @ready.size
      while count.positive? && (waiter = @ready.shift)
        count -= 1
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
        timeout = if !@ready.empty? then 0
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

    # Wakes the waiters on +io+ that want some of +events+ (a waiter already woken for the other
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

    # ---- closing, interrupting and the other threads ----------------------------------------------

    def signal
      return if @forks != SelectLoop.forks # the parent's pipe: the loop starts over before it waits

      pipe = @wakeup_w
      pipe.write_nonblock(".", exception: false) if pipe && !pipe.closed?
    end

    # A request from another thread, served by the loop on its own thread.
    def request(kind, subject, argument)
      @requests << [kind, subject, argument, SelectLoop.forks]
      signal if Thread.current != @thread # always: the loop may be on its way into IO.select
    end

    # Whether a fiber waits on +io+, or did until the loop's last turn (see knows in close.c): another
    # thread closing it tells the loop even when no fiber waits right now, as one may be about to.
    # Asked from any thread.
    def knows?(io)
      @forks == SelectLoop.forks && @watched.key?(io)
    end

    # Whether this loop belongs to the calling thread.
    def owned_here?
      Thread.current == @thread
    end

    # Whether the calling fiber can let this loop run and come back (as can_yield_to in close.c).
    def can_yield?
      current = Fiber.current
      current == @loop_fiber || (@running.positive? && current == @current)
    end

    # IO#close of +io+ (see {.closing}), before the descriptor closes: on the loop's own thread its
    # waiters are woken at once, another thread's loop is asked to.
    def io_closing(io)
      if Thread.current == @thread then close_io(io, elsewhere: false)
      else request(:closed, io, nil)
      end
    end

    # Wakes the loop's waiters on +io+ with CLOSED, on the loop's own thread (see loop_close_io in
    # loop.c). +elsewhere+: for another thread, which may not have marked io closed yet: until it
    # has, a new wait on io ends at once too (see #closing?).
    def close_io(io, elsewhere:)
      @closing[io] = true if elsewhere && !io.closed?
      list = @watched[io] or return
      list.keys.each { |waiter| wake(waiter, CLOSED) }
    end

    # Whether another thread closes +io+ and has not marked it closed yet.
    def closing?(io)
      return false if @closing.empty? || !@closing.key?(io)
      return true unless io.closed?

      @closing.delete(io) # Ruby's own checks see it now
      false
    end

    # Serves the other threads' requests; fiber interrupts only when +interrupts+ (they switch
    # fibers: not while IO.select's result waits to be dispatched). The unblocks come first: the C
    # loop's #unblock readies the fiber there and then, under the GVL, while closes and interrupts
    # wait for the loop's thread, so of the requests made during one wait the unblocked fibers run
    # first there.
    def take_requests(interrupts:)
      requests = []
      requests << @requests.pop(true) until @requests.empty?
      unblocks, others = requests.partition { |request| request.first == :unblock }
      later = []
      own = nil
      (unblocks + others).each do |kind, subject, argument, forks|
        next if forks != @forks # made in the parent, before the fork

        case kind
        when :closed then close_io(subject, elsewhere: true)
        when :unblock
          waiter = @unblockable[subject]
          wake(waiter, 1) if waiter && (@resumes[subject] || 0) == argument
        when :interrupt
          if !interrupts then later << [kind, subject, argument, forks]
          elsif subject.equal?(Fiber.current) then own = argument
          elsif subject.alive? # a stand-in's own alive?
            # Not with #rescuing: the fiber must come back to the loop fiber, not to a helper.
            begin
              if subject.is_a?(Fiber) then raise_into(subject, argument)
              else raise_through(subject, argument)
              end
            rescue FiberError
              nil # not suspended any more (it resumed another fiber): nothing to interrupt
            end
          end
        end
      end
      later.each { |item| @requests << item }
      raise own if own
    end

    # The fibers suspended in the loop, for tearing it down.
    def suspended_fibers
      check
      fibers = {}.compare_by_identity
      @ready.each { |waiter| fibers[waiter.fiber] = true if waiter.state == :ready }
      @timers.each do |timer|
        target = timer.target
        fibers[target.fiber] = true if target.is_a?(Waiter)
      end
      @watched.each_value { |list| list.each { |waiter, _| fibers[waiter.fiber] = true } }
      @unblockable.each_key { |fiber| fibers[fiber] = true }
      fibers.delete(Fiber.current)
      fibers.keys
    end

    # process_wait's helpers: this loop cannot watch a process itself (a thread waits instead).
    def wait_child_exit(_pid)
      nil
    end

    def pidfd_open(_pid)
      nil
    end
  end
end
