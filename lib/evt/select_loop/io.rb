# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's transfers and readiness, as ext/evt/io.c.

    private

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

    # -EAGAIN, as the transfer hooks return it: the descriptor is not ready.
    # @api private
    EAGAIN = -Errno::EAGAIN::Errno
    # -EINTR: a transfer interrupted by a signal, to try again.
    # @api private
    EINTR = -Errno::EINTR::Errno
    # -EINVAL, as the transfer hooks return it: a range outside the buffer, a negative position.
    # @api private
    EINVAL = -Errno::EINVAL::Errno
    # POSIX's least: a writable pipe in blocking mode takes this much without blocking.
    # @api private
    PIPE_BUF = 512

    # Both conventions of the transfer hooks, whichever this Ruby calls (see io.c): the public io_read
    # and io_write are one or the other, and tests reach both on any Ruby. Positioned transfers at a
    # negative `from` are -EINVAL, as pread(2) says (Ruby names the file).

    # Ruby 4.1's io_read: one read into `buffer` at `offset` of at most `length` bytes.
    # @return [Integer] bytes read (0: end of file), or -errno: -EAGAIN when nothing is ready (Ruby
    #   then calls io_wait), -EINVAL when the range is not inside the buffer
    def io_read_single(io, buffer, offset, length)
      transfer_single_hook(io, buffer, offset, length, nil, IO::READABLE)
    end

    # Ruby 4.1's io_write: one write from `buffer` at `offset` of at most `length` bytes.
    # @return [Integer] bytes written, or -errno, as io_read_single
    def io_write_single(io, buffer, offset, length)
      transfer_single_hook(io, buffer, offset, length, nil, IO::WRITABLE)
    end

    # Ruby 4.1's io_pread: as io_read_single, at file position `from` (which does not move).
    def io_pread_single(io, buffer, from, offset, length)
      return EINVAL if from.negative?

      transfer_single_hook(io, buffer, offset, length, from, IO::READABLE)
    end

    # Ruby 4.1's io_pwrite: as io_write_single, at file position `from` (which does not move).
    def io_pwrite_single(io, buffer, from, offset, length)
      return EINVAL if from.negative?

      transfer_single_hook(io, buffer, offset, length, from, IO::WRITABLE)
    end

    # Ruby 3.3 to 4.0's io_read: reads into `buffer` from `offset` at least `length` bytes, end of
    # file or an error (`length` 0: whatever one read gives; -EAGAIN only for read_nonblock, which
    # must not wait).
    # @return [Integer] bytes read, or -errno
    def io_read_minimum(io, buffer, length, offset)
      transfer_minimum(io, buffer, length, offset, nil, IO::READABLE)
    end

    # Ruby 3.3 to 4.0's io_write: writes from `buffer` at `offset` at least `length` bytes or an
    # error (`length` 0: whatever one write takes).
    # @return [Integer] bytes written, or -errno
    def io_write_minimum(io, buffer, length, offset)
      transfer_minimum(io, buffer, length, offset, nil, IO::WRITABLE)
    end

    # Ruby 3.3 to 4.0's io_pread: as io_read_minimum, at file position `from` (which does not move).
    # -ESPIPE for a pipe or socket, as pread(2) says.
    def io_pread_minimum(io, buffer, from, length, offset)
      return EINVAL if from.negative?

      transfer_minimum(io, buffer, length, offset, from, IO::READABLE)
    end

    # Ruby 3.3 to 4.0's io_pwrite: as io_write_minimum, at file position `from` (the hook on 4.0
    # only: 3.3 and 3.4 call io_pwrite without the GVL, where no Ruby code may run).
    def io_pwrite_minimum(io, buffer, from, length, offset)
      return EINVAL if from.negative?

      transfer_minimum(io, buffer, length, offset, from, IO::WRITABLE)
    end

    # One transfer of at most `length` bytes (see transfer_single_hook in io.c). Nothing to move is
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

    # Transfers until at least `length` bytes (0: one successful transfer), end of file or an error,
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
    # @api private
    UNINTERRUPTED = { Exception => :never }.freeze

    # The primitive every transfer is made of: one read(2) or write(2) (pread, pwrite at `position`
    # unless it is nil) between the buffer at `offset` and `io`, of at most `max` bytes, or up to the
    # end of the buffer when `max` is nil. Never waits: a descriptor in blocking mode is polled first,
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

    # Whether `length` bytes at `offset` are inside a buffer of `size` bytes.
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

    # Whether `io`'s descriptor is in blocking mode (a FIFO, a tty, a pipe after `nonblock =
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
  end
end
