# frozen_string_literal: true

module Evt
  class SelectLoop
    # IO#close under the pure-Ruby loop, and the other threads' requests, as ext/evt/close.c.

    @forks = 0

    class << self
      # Counts forks, so a loop can tell it was inherited (see {ForkWatch}).
      # @api private
      # @return [Integer] how many forks this process is down from the first (0 there)
      attr_reader :forks

      # {ForkWatch}'s count, in the child.
      # @api private
      # @return [Integer]
      def forked
        @forks += 1
      end

      # Every select loop of this Ractor, for IO#close to look through; weakly held. (Another
      # Ractor's loops cannot know this one's IOs, and may not be touched from here.)
      # @api private
      # @return [ObjectSpace::WeakMap] loop => true
      def loops
        Ractor.current[:evt_select_loops] ||= ObjectSpace::WeakMap.new
      end

      # IO#close (and close_read, close_write) of `io`, from any thread, before the descriptor
      # closes (see evt_close_io in close.c): the waiters on that IO object, in every select loop
      # that knows it, raise IOError. The block, if given, says whether the call closes the
      # descriptor at all; it is asked only when a loop knows `io` (it may cost system calls).
      #
      # Ruby 4.0 interrupts the waiting fibers itself through the closing thread's scheduler,
      # unless the closer is a blocking fiber (its wait for them would block the thread for ever:
      # that scheduler's woken fibers run first here) or the thread has none; other threads' loops
      # hear of it as on 3.x (a wait begun there while the close flushes).
      # @api private
      # @return [void]
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
      # @api private
      # @return [Symbol] :wake, :wake_run or :none
      def own_loops(scheduler)
        return :wake if RUBY_VERSION < "4" || scheduler.nil?

        Fiber.current_scheduler ? :none : :wake_run
      end

      # Once `io` is closed, the loops that still know it hear of it again: a fiber may have begun
      # to wait on it during the close (while it flushed), or Ruby closed it where close.c's
      # conditions say it does not (IO#close_read of a socket already shut down for writing closes
      # it). IO.select does not notice a descriptor closed under it. (BasicSocket's own close_read
      # and close_write never come here: the loop finds their IO closed on its next turn.)
      # @api private
      # @return [void]
      def closed(io)
        return unless io.closed?

        loops.each_key { |loop| loop.__send__(:io_closing, io) if loop.__send__(:knows?, io) }
      end

      # The IO that IO.popen's "r+" IO writes through, while it is open: Ruby keeps it in an
      # instance variable (close.c reads rb_io_t's tied_io_for_writing).
      # @api private
      # @return [IO, nil]
      def write_io(io)
        tied = io.instance_variable_get(:@tied_io_for_writing)
        tied unless tied.nil? || tied.closed?
      end

      # Whether close_read (`direction` :read) or close_write (:write) of `io` closes its descriptor,
      # as close.c decides: not for a socket (shut down instead, which its waiters see as end of
      # file or an error), nor for an IO open for the other direction only (IOError). Ruby's own
      # mode for the IO is not visible from Ruby: the descriptor's access mode stands in for it,
      # the same but for an IO.new narrower than its descriptor; unknown (no fcntl), it closes.
      # @api private
      # @return [Boolean]
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
      # @api private
      # @return [void]
      def watch_closes
        return if IO.include?(ReadNonblockWatch)

        IO.prepend(CloseWatch, ReadNonblockWatch)
      end
    end

    # Prepended to IO once the first select loop exists: Ruby 3.3 and 3.4 call no scheduler hook on
    # close. As ext/evt/close.c does for the C loop, and on the same conditions, the waiters are
    # told before the descriptor closes: a close may wait itself (flushing a buffered write to a full
    # pipe), and the fibers waiting on the IO must not go on meanwhile as if it were still open.
    # @api private
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
    # rb_profile_frames; caller_locations would build a backtrace on every read.)
    # @api private
    module ReadNonblockWatch
      # IO#read_nonblock, with io_read told not to wait.
      def read_nonblock(...)
        Thread.current[:__evt_read_nonblock] = true
        super(...)
      ensure
        Thread.current[:__evt_read_nonblock] = nil
      end
    end

    private

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

    # Whether a fiber waits on `io`, or did until the loop's last turn (see knows in close.c): another
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

    # IO#close of `io` (see {.closing}), before the descriptor closes: on the loop's own thread its
    # waiters are woken at once, another thread's loop is asked to.
    def io_closing(io)
      if Thread.current == @thread then close_io(io, elsewhere: false)
      else request(:closed, io, nil)
      end
    end

    # Wakes the loop's waiters on `io` with CLOSED, on the loop's own thread (see loop_close_io in
    # loop.c). `elsewhere`: for another thread, which may not have marked io closed yet: until it
    # has, a new wait on io ends at once too (see #closing?).
    def close_io(io, elsewhere:)
      @closing[io] = true if elsewhere && !io.closed?
      list = @watched[io] or return
      list.keys.each { |waiter| wake(waiter, CLOSED) }
    end

    # Whether another thread closes `io` and has not marked it closed yet.
    def closing?(io)
      return false if @closing.empty? || !@closing.key?(io)
      return true unless io.closed?

      @closing.delete(io) # Ruby's own checks see it now
      false
    end

    # Serves the other threads' requests; fiber interrupts only when `interrupts` (they switch
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
