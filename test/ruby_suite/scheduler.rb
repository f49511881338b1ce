# frozen_string_literal: true

# Stands in for the scheduler.rb of Ruby's own test/fiber (see test/ruby_suite/run): the tests there
# `require_relative "scheduler"` and use the classes below. Here every one of them is evt's scheduler,
# so Ruby's conformance tests exercise evt on the backend EVT_BACKEND names.
#
# Ruby's file defines a reference scheduler plus subclasses that misbehave on purpose (an unblock
# that raises, one that sleeps, a kernel_sleep that first blocks the thread). Those subclasses are
# kept, each built on evt's scheduler the way a user's subclass would be, so the tests see how evt
# copes with them.
require "evt"
require "socket"
begin
  require "io/nonblock" # Ruby's scheduler.rb loads it, and its tests call IO#nonblock=
rescue LoadError
  nil
end

# Evt::Scheduler, plus the two helpers of Ruby's reference scheduler that its tests call besides the
# hooks: #transfer and #waiting.
class Scheduler < Evt::Scheduler
  def initialize(...)
    @creator = Fiber.current
    super
  end

  # Switches to the fiber that made the scheduler (test_mutex uses it to leave a fiber mid-way).
  def transfer
    @creator.transfer
  end

  # The fibers suspended in the loop (the reference scheduler's list of sleeping fibers).
  def waiting
    suspended_fibers
  end
end

# Ruby's file gives this one io_read/io_write/io_pread/io_pwrite hooks built on IO::Buffer; evt's
# own hooks already are, so the tests that use it run on evt's.
class IOBufferScheduler < Scheduler
end

# An unblock that raises once it has done its work: the exception must not vanish.
class BrokenUnblockScheduler < Scheduler
  def unblock(blocker, fiber)
    super
    raise "Broken unblock!"
  end
end

# An unblock that sleeps once it has done its work (it runs on the thread that unblocks).
class SleepingUnblockScheduler < Scheduler
  def unblock(blocker, fiber)
    super
    sleep(0.1)
  end
end

# A kernel_sleep that blocks the whole thread for a moment before it suspends the fiber: an unblock
# that arrives meanwhile must still wake it.
class SleepingBlockingScheduler < Scheduler
  def kernel_sleep(duration = nil)
    Fiber.blocking { sleep 0.0001 }
    block(:sleep, duration)
    true
  end
end

# Ruby 4.0's test_io_write_on_flush: every io_write is recorded (an IO's buffered data is flushed
# through io_write there), then done by evt's own.
class IOScheduler < Scheduler
  def operations
    @operations ||= []
  end

  def io_write(io, buffer, *arguments)
    operations << [:io_write, io.fileno, buffer.get_string]
    super
  end
end

# Ruby 4.0's tests of errors from the hooks: every read fails with EBADF, every write with EINVAL,
# and Ruby must raise them.
class IOErrorScheduler < Scheduler
  def io_read(*)
    -Errno::EBADF::Errno
  end

  def io_write(*)
    -Errno::EINVAL::Errno
  end
end
