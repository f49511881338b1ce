# frozen_string_literal: true

module Evt
  class SelectLoop
    # The pure-Ruby loop's IO hooks. Every transfer is one primitive (#transfer_single) under both
    # conventions of the hooks: *_minimum, Ruby 3.3 to 4.0's (at least `length` bytes, waiting as
    # needed), and *_single, Ruby 4.1's (one transfer, or -EAGAIN); io_read and friends are this
    # Ruby's. io_pread and io_pwrite only from Ruby 4.0: 3.3 and 3.4 call io_pwrite without the GVL,
    # where no Ruby code may run (they are on files, which never wait: Ruby does them itself there).
    # Ruby would read and write without these hooks, as under its reference scheduler, but its own
    # path then raises a stray IO::TimeoutError and blocks the thread on a descriptor in blocking
    # mode (docs/behaviour.md, "A read after another fiber's IO#timeout").

    EAGAIN = -Errno::EAGAIN::Errno # as the transfer hooks return it: not ready
    EINTR = -Errno::EINTR::Errno # a transfer a signal interrupted, to try again
    EINVAL = -Errno::EINVAL::Errno # a range outside the buffer, a negative position
    EBADF = -Errno::EBADF::Errno # the descriptor is gone: another thread closed the IO meanwhile
    PIPE_BUF = 512 # what a writable pipe in blocking mode takes without blocking (POSIX's least)
    private_constant :EAGAIN, :EINTR, :EINVAL, :EBADF, :PIPE_BUF

    # (see Evt::Loop#io_wait)
    def io_wait(io, events, timeout)
      get
      io.fileno # IOError for a closed stream, as Ruby raises
      timeout = interval(timeout.nil? && io.is_a?(IO) ? io.timeout : timeout)
      events &= EVENTS
      ready = ready_now(io, events) # a ready IO does not wait for a turn
      return ready unless ready.zero?
      return false if timeout&.zero? || events.zero?

      result = wait_io(io, events, timeout)
      result == :timed_out ? false : result
    end

    if INTERFACE >= 4
      # (see Evt::Loop#io_read)
      def io_read(io, buffer, offset, length) = io_read_single(io, buffer, offset, length)
      # (see Evt::Loop#io_write)
      def io_write(io, buffer, offset, length) = io_write_single(io, buffer, offset, length)
      # (see Evt::Loop#io_pread)
      def io_pread(io, buffer, from, offset, length) = io_pread_single(io, buffer, from, offset, length)
      # (see Evt::Loop#io_pwrite)
      def io_pwrite(io, buffer, from, offset, length) = io_pwrite_single(io, buffer, from, offset, length)
    else
      # (see Evt::Loop#io_read)
      def io_read(io, buffer, length, offset) = io_read_minimum(io, buffer, length, offset)
      # (see Evt::Loop#io_write)
      def io_write(io, buffer, length, offset) = io_write_minimum(io, buffer, length, offset)
      if RUBY_VERSION >= "4"
        # (see Evt::Loop#io_pread)
        def io_pread(io, buffer, from, length, offset) = io_pread_minimum(io, buffer, from, length, offset)
        # (see Evt::Loop#io_pwrite)
        def io_pwrite(io, buffer, from, length, offset) = io_pwrite_minimum(io, buffer, from, length, offset)
      end
    end

    private

    # (Defined with def: a method define_method made cannot be called in another Ractor.)
    def io_read_single(io, buffer, offset, length) = single(io, buffer, offset, length, nil, IO::READABLE)
    def io_write_single(io, buffer, offset, length) = single(io, buffer, offset, length, nil, IO::WRITABLE)
    def io_pread_single(io, buffer, from, offset, length) = single(io, buffer, offset, length, from, IO::READABLE)
    def io_pwrite_single(io, buffer, from, offset, length) = single(io, buffer, offset, length, from, IO::WRITABLE)
    def io_read_minimum(io, buffer, length, offset) = minimum(io, buffer, length, offset, nil, IO::READABLE)
    def io_write_minimum(io, buffer, length, offset) = minimum(io, buffer, length, offset, nil, IO::WRITABLE)
    def io_pread_minimum(io, buffer, from, length, offset) = minimum(io, buffer, length, offset, from, IO::READABLE)
    def io_pwrite_minimum(io, buffer, from, length, offset) = minimum(io, buffer, length, offset, from, IO::WRITABLE)

    # IO.select from a blocking fiber, so that it does not come back here as io_select.
    def select_now(readables, writables, exceptables)
      Fiber.blocking { IO.select(readables, writables, exceptables, 0) }
    end

    def ready_now(io, events)
      result = select_now(*[IO::READABLE, IO::WRITABLE, IO::PRIORITY].map { |e| [io] if events.anybits?(e) }) or return 0
      result.zip([IO::READABLE, IO::WRITABLE, IO::PRIORITY]).sum { |ready, event| ready.empty? ? 0 : event }
    end

    # One transfer of at most `length` bytes (at file position `from` unless nil), or -errno.
    def single(io, buffer, offset, length, from, events)
      get
      io.fileno # IOError for a closed stream
      return EINVAL if from&.negative?
      return inside?(buffer.size, offset, 0) ? 0 : EINVAL if length.zero?

      blocking = blocking_mode?(io)
      while (result = transfer_single(io, buffer, offset, length, from, events, blocking)) == EINTR; end
      result
    end

    # Transfers until `length` bytes (0: one transfer), end of file or an error, waiting on EAGAIN;
    # only read_nonblock must not wait ({ReadNonblockWatch} says so).
    def minimum(io, buffer, length, offset, from, events)
      get
      io.fileno # IOError for a closed stream
      return EINVAL if from&.negative?

      blocking = blocking_mode?(io)
      length = 1 if length.zero? && from.nil? && !(events == IO::READABLE && Thread.current[:__evt_read_nonblock])
      total = 0
      while true # rubocop:disable Style/InfiniteLoop
        result = transfer_single(io, buffer, offset + total, nil, from && (from + total), events, blocking)
        if result.positive?
          return total if (total += result) >= length
        elsif result == EAGAIN
          return total.positive? ? total : EAGAIN if total >= length

          wait_for_transfer(io, events)
        elsif result != EINTR
          return total.positive? || result.zero? ? total : result # an error shows on the next call
        end
      end
    end

    # The primitive: one read(2) or write(2) (pread or pwrite at `position` unless nil) between the
    # buffer at `offset` and `io`, of at most `max` bytes (nil: to the buffer's end). Never waits: a
    # descriptor in blocking mode is polled first, and written PIPE_BUF bytes at a time. From a
    # blocking fiber, so IO::Buffer makes the system call itself; asynchronous exceptions wait until
    # it returns (another thread's IO#close raises one here, and inside the closer's #unblock on its
    # way out it would lose the wakeup, and leave Ruby's mutex locked).
    def transfer_single(io, buffer, offset, max, position, events, blocking) # rubocop:disable Metrics/ParameterLists
      size = buffer.size # asked every time: another fiber may have resized the buffer
      if max.nil?
        raise ArgumentError, "offset #{offset} is past the end of the buffer (#{size} bytes)" if offset > size

        max = size - offset
      elsif !inside?(size, offset, max)
        return EINVAL
      end
      return EAGAIN if blocking && ready_now(io, events).zero?

      max = PIPE_BUF if blocking && events == IO::WRITABLE && max > PIPE_BUF
      buffer, offset = buffer.slice(offset, max), 0 unless max == size - offset # IO::Buffer goes to its end
      result = Fiber.blocking do
        Thread.handle_interrupt(Exception => :never) do
          if events == IO::READABLE then position ? buffer.pread(io, position, 0, offset) : buffer.read(io, 0, offset)
          else position ? buffer.pwrite(io, position, 0, offset) : buffer.write(io, 0, offset)
          end
        end
      end
      closed_meanwhile(io) if result == EBADF
      result
    rescue Errno::EBADF
      closed_meanwhile(io)
      raise
    end

    # Another thread closed `io` during a transfer (Ruby 3.3 and 3.4 do not wait for it, as 4.0
    # does): IOError, as a thread reading it gets, not the descriptor's EBADF.
    def closed_meanwhile(io)
      raise IOError, "stream closed in another thread" if io.closed?
    end

    def inside?(size, offset, length) = !offset.negative? && !length.negative? && offset <= size && length <= size - offset

    # Waits as a read or write would, under the IO's own #timeout.
    def wait_for_transfer(io, events)
      timeout = io.is_a?(IO) ? interval(io.timeout) : nil
      raise IO::TimeoutError, "Blocking operation timed out!" if wait_io(io, events, timeout) == :timed_out

      io.fileno # closed meanwhile: raise rather than transfer on a number another file may have now
    end

    # Whether `io` is in blocking mode (a FIFO, a tty, a pipe after `nonblock = false`) and not a
    # file, learnt once per IO. Ruby 3.3 refuses IO#nonblock? outside the main Ractor: fcntl there.
    def blocking_mode?(io)
      known = @blocking_modes[io]
      return known unless known.nil?

      blocking = if RUBY_VERSION < "3.4" && Ractor.current != Ractor.main && defined?(Fcntl::O_NONBLOCK)
                   (Fiber.blocking { io.fcntl(Fcntl::F_GETFL) } & Fcntl::O_NONBLOCK).zero?
                 else
                   io.respond_to?(:nonblock?) && !io.nonblock?
                 end
      @blocking_modes[io] = blocking && !(stat = io.stat).file? && !stat.blockdev?
    end
  end
end
