# frozen_string_literal: true

module Evt
  class SelectLoop
    # IO#close under the pure-Ruby loop. Ruby 3.3 and 3.4 tell no scheduler: the waiters on the IO,
    # in every select loop of this Ractor that knows it, are told before the descriptor closes (a
    # close may wait itself, flushing to a full pipe) and raise IOError, as threads do. Ruby 4.0
    # interrupts them itself through the closing thread's scheduler, unless the closer is a blocking
    # fiber (its wait for them would block the thread: they are woken, and run, here); other threads'
    # loops hear of it as on 3.x (a wait may begin there while the close flushes).
    class << self
      # Tells the loops that know `io` it is closing; the block, if given, says whether the call
      # closes the descriptor at all (asked only when a loop knows `io`).
      # @api private
      def closing(io)
        scheduler = Fiber.scheduler
        own = if RUBY_VERSION < "4" || scheduler.nil? then :wake
              elsif Fiber.current_scheduler then :none # Ruby 4.0 tells them
              else :wake_run
              end
        closes = yield_to = nil
        loops.each_key do |loop|
          next unless loop.__send__(:knows?, io)

          here = loop.__send__(:owned_here?)
          next if here && own == :none
          next unless (closes = closes.nil? ? !block_given? || yield : closes)

          if here && own == :wake_run
            next unless loop.equal?(scheduler) && loop.__send__(:can_yield?)

            loop.__send__(:close_io, io)
            yield_to = loop
          else
            loop.__send__(:io_closing, io)
          end
        end
        yield_to&.kernel_sleep(0) # the woken fibers leave their waits before Ruby's close waits for them
      end

      # Once `io` is closed, the loops that still know it hear of it again: a fiber may have begun to
      # wait during the close, or Ruby closed it where #closes_for? said it would not.
      # @api private
      def closed(io)
        loops.each_key { |loop| loop.__send__(:io_closing, io) if loop.__send__(:knows?, io) } if io.closed?
      end

      # Runs the block with `ios` noted as what this fiber closes: Ruby 4.0's fiber_interrupt, which
      # the close calls, is then for the waits on them (SelectLoop#fiber_interrupt).
      # @api private
      def closing_these(ios)
        return yield if Thread.current.frozen? # no note: the close goes on without

        before = Thread.current[:__evt_closing]
        begin
          Thread.current[:__evt_closing] = ios
          yield
        ensure
          Thread.current[:__evt_closing] = before
        end
      end

      # @api private
      # @return [IO, nil] the IO that IO.popen's "r+" IO writes through, while it is open
      def write_io(io)
        tied = io.instance_variable_get(:@tied_io_for_writing)
        tied unless tied.nil? || tied.closed?
      end

      # Whether close_read (`direction` :read) or close_write of `io` closes its descriptor: not for a
      # socket (shut down instead), nor for an IO open the other way only (IOError). The access mode
      # stands in for Ruby's own mode of the IO, which Ruby code cannot see. Blocking looks: Ruby 3.4
      # would hand them to a worker thread, while the fibers wait to be told.
      # @api private
      # @return [Boolean]
      def closes_for?(io, direction)
        return false if Fiber.blocking { io.stat.socket? } || (defined?(BasicSocket) && io.is_a?(BasicSocket))

        mode = Fiber.blocking { io.fcntl(Fcntl::F_GETFL) } & Fcntl::O_ACCMODE
        mode != (direction == :read ? File::WRONLY : File::RDONLY)
      rescue StandardError, NotImplementedError
        true # not known: it closes
      end
    end

    # Prepended to IO when this file loads (see {SelectLoop.closing}).
    # @api private
    module CloseWatch
      # The waiters on this IO, and on the IO its writes go to (IO.popen's "r+"), first.
      def close
        unless closed?
          SelectLoop.closing(self)
          write_io = SelectLoop.write_io(self)
          SelectLoop.closing(write_io) if write_io
        end
        # close(2) runs here (Scheduling#blocking_operation_wait); a frozen Thread takes no note
        Thread.current[:__evt_inline_offload] = true unless (frozen = Thread.current.frozen?)
        SelectLoop.closing_these([self, write_io].compact) { super }
      ensure
        Thread.current[:__evt_inline_offload] = nil unless frozen
        SelectLoop.closed(self)
        SelectLoop.closed(write_io) if write_io
      end

      # The waiters first, if it closes the descriptor (not a socket's: shut down, its readers see
      # end of file).
      def close_read
        SelectLoop.closing(self) { SelectLoop.closes_for?(self, :read) } unless closed?
        SelectLoop.closing_these([self]) { super }
      ensure
        SelectLoop.closed(self)
      end

      # The same, for the IO writes go to.
      def close_write
        write_io = SelectLoop.write_io(self) || self
        SelectLoop.closing(write_io) { SelectLoop.closes_for?(write_io, :write) } unless write_io.closed?
        SelectLoop.closing_these([write_io]) { super }
      ensure
        SelectLoop.closed(write_io) if write_io
      end
    end

    # Ruby sends read_nonblock and sysread to io_read with the same arguments, yet only the first
    # must not wait: a fiber-local flag tells io_read.
    # @api private
    module ReadNonblockWatch
      # IO#read_nonblock, io_read told not to wait.
      def read_nonblock(...)
        Thread.current[:__evt_read_nonblock] = true
        super
      ensure
        Thread.current[:__evt_read_nonblock] = nil
      end
    end

    # Now, while one Ractor runs: files load in the main Ractor, but loops start in any. Ruby 3.3
    # corrupts IO's method table when Ractors prepend to it at once (a [BUG] in the GC, or in
    # prepend itself).
    IO.prepend(CloseWatch, ReadNonblockWatch)
  end
end
