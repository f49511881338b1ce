# frozen_string_literal: true

require_relative "evt/version"
require_relative "evt/hook_table"

module Evt
  # The error `require "evt"` raises under EVT_REQUIRE_EXTENSION=1 when the C extension cannot be
  # loaded: its message says why, and what to run.
  class ExtensionMissing < LoadError; end

  # Loads the C extension (Evt::Loop and its backends); nil when it is loaded, else why not and what
  # to do about it. Where it cannot be built or loaded (no compiler, JRuby, TruffleRuby, Windows),
  # evt runs on the pure-Ruby select backend; EVT_NO_EXTENSION=1 asks for that path.
  # @api private
  # @return [String, nil]
  def self.load_extension
    return "EVT_NO_EXTENSION=1" if ENV["EVT_NO_EXTENSION"] == "1"

    # A development build (rake compile; a precompiled gem has one per Ruby series), else the
    # build of a gem installed from source.
    features = ["evt/#{RUBY_VERSION[/\A\d+\.\d+/]}/evt", "evt/evt"]
    found = features.filter_map { |feature| $LOAD_PATH.resolve_feature_path(feature) }.find { |kind, _| kind == :so }
    return extension_not_built unless found

    begin
      require found.last
    rescue LoadError => e
      return "#{found.last} cannot be loaded: #{e.message}#{extension_advice(e.message)}"
    end
    nil
  end
  private_class_method :load_extension

  # Why no build of the extension was found, and what to run: in a checkout (a Gemfile's `path:`,
  # which compiles nothing), rake compile; in an installed gem, its build log.
  # @api private
  # @return [String]
  def self.extension_not_built
    root = File.expand_path("..", __dir__)
    if File.exist?(File.join(root, "Rakefile")) && File.exist?(File.join(root, "ext/evt/extconf.rb"))
      return "it is not built in this checkout (a Gemfile's path: compiles nothing): run " \
             "`bundle exec rake compile` in #{root} (it needs a C compiler, and liburing's headers for io_uring)"
    end

    log = Gem.loaded_specs["evt"]&.extension_dir&.then { |dir| File.join(dir, "gem_make.out") }
    "it was not built when the gem was installed#{log && File.exist?(log) ? " (#{log} says why)" : ""}: " \
      "install a C compiler (and liburing's headers for io_uring) and run `gem pristine evt`, " \
      "or install the precompiled gem of your platform"
  end
  private_class_method :extension_not_built

  # @api private
  # @param message [String] the loader's
  # @return [String] what to do, for the failures evt knows
  def self.extension_advice(message)
    return "" unless message.include?("liburing")

    " (the build links the system's liburing, which is not installed here: install it, as " \
      "Debian's and Ubuntu's liburing2 package, or use the precompiled gem, which carries its own)"
  end
  private_class_method :extension_advice

  # The pure-Ruby loop: loaded at its first use (without the extension, at once).
  autoload :SelectLoop, File.expand_path("evt/select_loop", __dir__)

  missing = load_extension
  # Strict mode raises before anything depends on the extension (a second require tries again).
  if missing && ENV["EVT_REQUIRE_EXTENSION"] == "1"
    raise ExtensionMissing, "evt: EVT_REQUIRE_EXTENSION=1, and the C extension is not loaded: #{missing}"
  end

  # Why the C extension is not in use (what the loader said and what to do, or
  # "EVT_NO_EXTENSION=1"), or nil when it is loaded. {extension?} is the yes-or-no form.
  EXTENSION_MISSING = missing
  if EXTENSION_MISSING
    warn "evt: the C extension is not loaded (#{EXTENSION_MISSING}); using the pure-Ruby select backend" \
      unless ENV["EVT_NO_EXTENSION"] == "1"
    # The loop Evt::Scheduler runs on: the select loop, where the extension would have put its own.
    class Loop < SelectLoop; end
  end

  # Evt::Loop as the C extension defines it (ext/evt/evt.c, io.c, hooks.c): the one place its methods
  # are described (the C code says why, the pure-Ruby loop refers here, sig/ has the types). YARD
  # reads no C file but selector.c (see .yardopts); test/yard_test.rb holds this block to the
  # rb_define_method calls there.
  #
  # @!parse
  #   # The event loop in C (ext/evt/), on one backend: the class {Scheduler} inherits from. It
  #   # answers the hooks Ruby calls most often (IO waits and transfers, sleep, block and unblock,
  #   # IO.select, timeouts) without running any Ruby code; {Scheduling} adds the hooks written in
  #   # Ruby. Where the extension is not loaded, Evt::Loop is instead an empty subclass of
  #   # {SelectLoop}, the loop written in Ruby, with the same methods.
  #   #
  #   # The hook methods are Ruby's Fiber::Scheduler interface: Ruby calls them, from the
  #   # non-blocking fibers of the thread whose scheduler this is. Code that uses evt does not call
  #   # them; {Evt::HOOKS} lists each one with the Rubies that call it.
  #   class Loop < Object
  #     # The scheduler interface version (RUBY_FIBER_SCHEDULER_VERSION) of the Ruby the extension
  #     # was compiled for: from 4, Ruby passes io_read and friends their offset before the length.
  #     FIBER_SCHEDULER_VERSION = RUBY_FIBER_SCHEDULER_VERSION
  #
  #     # @!method self.backends
  #     #   The backends this build has, fastest first, whether or not they can run on this
  #     #   machine ({probe} says; {Choosing#availables} lists those that can).
  #     #   @return [Array<Symbol>] some of :kqueue, :io_uring, :epoll, :poll and :select
  #
  #     # @!method self.emulation(name)
  #     #   What stands in for the backend's kernel mechanism here: "libkqueue, over epoll" for
  #     #   kqueue on Linux (a backend there to be tested, never the automatic choice).
  #     #   @param name [Symbol, String]
  #     #   @return [String, nil] nil when the kernel has the mechanism, or the name is unknown
  #     #   @raise [TypeError] `name` is not a Symbol or String
  #
  #     # @!method self.probe(name)
  #     #   Whether the backend `name` can run here.
  #     #   @param name [Symbol, String]
  #     #   @return [String, nil] nil when it can, else why not ("unknown backend" for a name
  #     #     this build does not have)
  #     #   @raise [TypeError] `name` is not a Symbol or String
  #
  #     # @!method initialize(backend)
  #     #   A loop on `backend`, owned by the current thread; its kernel objects are opened now.
  #     #   {Scheduler#initialize} chooses the backend for it.
  #     #   @param backend [Symbol, String] one of {backends}
  #     #   @raise [ArgumentError] the backend is unknown or cannot run here
  #
  #     # @!method run
  #     #   Runs the loop until no fiber waits in it. Call it from the blocking fiber that drives
  #     #   the scheduler (usually the thread's main fiber); {Evt.run} and
  #     #   Fiber.set_scheduler(nil) do.
  #     #   @return [self]
  #     #   @raise [FiberError] called from a scheduled fiber, or while the loop runs elsewhere
  #
  #     # @!method scheduler_close
  #     #   Hook: runs every fiber to completion, then releases the kernel objects (a later use
  #     #   opens new ones). Ruby calls it when the thread ends or another scheduler is set; the
  #     #   exception ending the thread, if any, stays in $!.
  #     #   @return [nil]
  #     #   @raise [FiberError] called from a scheduled fiber
  #
  #     # @!method wakeup
  #     #   Ends the loop's wait in the kernel, if it is in one. Safe from any thread.
  #     #   @return [nil]
  #
  #     # @!method backend
  #     #   @return [Symbol] the backend the loop runs on
  #
  #     # @!method closed?
  #     #   @return [Boolean] whether the kernel objects are released (a later use opens new ones)
  #
  #     # @!method waiting
  #     #   @return [Integer] the number of fibers suspended in the loop
  #
  #     # @!method stats
  #     #   The loop's counters since it was made ({Insight#stats} lists every key, with those a
  #     #   scheduler adds): kept as the loop runs, a few additions a turn, and read here.
  #     #   @return [Hash{Symbol => Object}] a new Hash each call
  #
  #     # @!method io_wait(io, events, timeout)
  #     #   Hook (IO#wait_readable and every read or write that has to wait): waits until `io` has
  #     #   one of `events`.
  #     #   @param io [IO]
  #     #   @param events [Integer] IO::READABLE, IO::WRITABLE, IO::PRIORITY, or'ed
  #     #   @param timeout [Numeric, nil] seconds; nil: the IO's own IO#timeout
  #     #   @return [Integer, false] the events that are ready, or false when the time ran out
  #
  #     # @!method io_read(io, buffer, length, offset)
  #     #   Hook (reads): reads into the IO::Buffer at `offset` at least `length` bytes (0: what
  #     #   one read gives), waiting in the loop as needed. Ruby 4.1 passes (io, buffer, offset,
  #     #   length) and wants one read of at most `length` bytes; the build follows the Ruby it
  #     #   was made for.
  #     #   @return [Integer] the bytes read (0: end of file), or -errno
  #
  #     # @!method io_write(io, buffer, length, offset)
  #     #   Hook (writes): writes from the IO::Buffer at `offset` at least `length` bytes, waiting
  #     #   as needed; the same two conventions as {#io_read}.
  #     #   @return [Integer] the bytes written, or -errno
  #
  #     # @!method io_pread(io, buffer, from, length, offset)
  #     #   Hook (IO#pread): as {#io_read}, at file position `from`, which does not move.
  #     #   @return [Integer] the bytes read, or -errno
  #
  #     # @!method io_pwrite(io, buffer, from, length, offset)
  #     #   Hook (IO#pwrite): as {#io_write}, at file position `from`, which does not move.
  #     #   @return [Integer] the bytes written, or -errno
  #
  #     # @!method io_select(readables, writables = nil, exceptables = nil, timeout = nil)
  #     #   Hook (IO.select): every IO is watched by the loop at once, without a thread.
  #     #   @return [Array<Array>, nil] what IO.select returns: the ready objects of each array, or
  #     #     nil when the time ran out
  #
  #     # @!method kernel_sleep(duration = nil)
  #     #   Hook (Kernel#sleep): sleeps `duration` seconds, or until {#unblock} (nil: no limit);
  #     #   sleep(0) lets the other ready fibers run first.
  #     #   @return [nil]
  #
  #     # @!method block(blocker, timeout = nil)
  #     #   Hook (Mutex, Queue, ConditionVariable, Thread#join...): suspends the current fiber until
  #     #   {#unblock} or `timeout` seconds. Ruby hands the timeout on unchecked (Queue#pop(timeout:)):
  #     #   as Ruby without a scheduler, a negative one has expired, NaN or one past Time's range never ends.
  #     #   @return [Boolean] true when unblocked, false when the time ran out
  #
  #     # @!method unblock(blocker, fiber)
  #     #   Hook: wakes `fiber` from {#block} or {#kernel_sleep}. Safe from any thread.
  #     #   @return [nil]
  #
  #     # @!method timeout_after(duration, exception_class, *arguments)
  #     #   Hook (Timeout.timeout): runs the block; if it still runs after `duration` seconds,
  #     #   raises exception_class.new(*arguments) in the fiber, wherever it waits. A timer on the
  #     #   loop's heap, removed when the block ends first.
  #     #   @yieldparam duration [Numeric]
  #     #   @return [Object] the block's value
  #
  #     # @!method io_close(fd)
  #     #   Hook (Ruby 4.0, IO#close): wakes whatever still waits on descriptor `fd` and closes it.
  #     #   @param fd [Integer]
  #     #   @return [Boolean] true when closed, false when `fd` was not open
  #
  #     # @!method fiber_interrupt(fiber, exception)
  #     #   Hook (Ruby 4.0): raises `exception` in `fiber`, which waits in this loop, on the loop's
  #     #   next turn, unless the wait it is for is over: the loop has resumed the fiber meanwhile
  #     #   (an event had made it ready) and it does not wait on the IOs being closed again (those
  #     #   of the `IO#close` that calls this, which evt's close notes; called otherwise, the IO of
  #     #   the fiber's wait when it came). The pure-Ruby loop, whose reads let another thread's
  #     #   close in while the fiber runs, drops one from a close whenever the fiber does not wait
  #     #   on those IOs. The exception would land in its next wait. Safe from any thread. `fiber`
  #     #   may also be an object that answers alive?, raise and transfer (a wrapper around a
  #     #   fiber), whose exception is always raised.
  #     #   @return [nil]
  #     #   @raise [TypeError] `fiber` is neither
  #   end

  # @return [Boolean] whether the C extension (its io_uring, epoll, kqueue, poll and select backends) is loaded.
  def self.extension?
    EXTENSION_MISSING.nil?
  end
end

module Evt
  # Ruby releases with a bug of their own that evt's users meet: version => what the bug is and
  # which release to take instead: always a later one, as the earlier releases of each series lack
  # security fixes (4.0.0-4.0.4 CVE-2026-46727; 3.4.9 others). `require "evt"` warns on these
  # ({ruby_warning}).
  RUBY_BUGS = {
    "3.4.10" => "the next 3.4 release (3.4.11 or later)", "4.0.4" => "4.0.7 or later",
    "4.0.5" => "4.0.7 or later", "4.0.6" => "4.0.7 or later",
  }.transform_values do |fixed|
    "a use-after-free in fiber switching (Ruby Bug #22196, fixed by ruby/ruby#17957): use #{fixed}"
  end.freeze

  # The warning `require "evt"` prints for Ruby `version` (see {RUBY_BUGS}).
  # @param version [String] a Ruby release, as in RUBY_VERSION
  # @return [String, nil] the warning, or nil when evt knows of no bug of that release
  def self.ruby_warning(version = RUBY_VERSION)
    bug = RUBY_BUGS[version] or return
    "evt: Ruby #{version} has #{bug}; a scheduler switches fibers all the time"
  end
end
Evt.ruby_warning&.then { |message| warn message }

module Evt
  autoload :Workers, File.expand_path("evt/workers", __dir__) # one event loop per core
end

require_relative "evt/resolver" # loads socket

# What the C extension prepends to IO and BasicSocket (ext/evt/closers.c, socket_write.c), and
# the error it defines on Ruby 3.3 and 3.4 (ext/evt/object.c), for YARD, which does not read those
# files.
#
# @!parse
#   module Evt
#     # Raised on Ruby 3.3 and 3.4, which crash when fibers run in two Ractors at once
#     # (ruby/ruby#13466), by a loop that opens while a loop of another Ractor is open; the
#     # Ractor may try again once the other's loops are closed. Not defined on Ruby 4.0, where
#     # loops in several Ractors run at once.
#     class RactorError < RuntimeError; end
#
#     # IO#close, #close_read and #close_write, prepended to IO by the C extension: before the
#     # descriptor closes, the fibers waiting on the IO in any evt loop are woken and raise IOError,
#     # as threads do (Ruby 3.3 and 3.4 call no scheduler hook on close; 4.0's io_close hook comes
#     # after). The pure-Ruby loop has its own ({SelectLoop::CloseWatch}).
#     # @api private
#     # @!method close
#     #   IO#close, the waiters woken first.
#     # @!method close_read
#     #   IO#close_read, the waiters woken first when it closes the descriptor.
#     # @!method close_write
#     #   IO#close_write, the waiters woken first when it closes the descriptor.
#     module CloseWakesWaiters; end
#
#     # BasicSocket's own #close_read and #close_write, which close the descriptor once both
#     # directions are shut down: they wake the waiters first too, as {CloseWakesWaiters} does.
#     # @api private
#     # @!method close_read
#     #   BasicSocket#close_read, the waiters woken first when it closes the descriptor.
#     # @!method close_write
#     #   BasicSocket#close_write, the waiters woken first when it closes the descriptor.
#     module SocketShutdownWakesWaiters; end
#   end
#
#   # Ruby's IO class. With the C extension, evt prepends {Evt::CloseWakesWaiters} to it; the
#   # pure-Ruby loop prepends {Evt::SelectLoop::CloseWatch} and {Evt::SelectLoop::ReadNonblockWatch}
#   # when it loads. `require "evt/async"` names evt's selector in io-event's
#   # namespace, IO::Event::Selector::Evt.
#   class IO
#     prepend Evt::CloseWakesWaiters
#   end
#
#   # Ruby's socket base class. evt prepends {Evt::SocketWrite} to it, so that #write with several
#   # strings (and #puts) makes one send under an evt scheduler; with the C extension, also
#   # {Evt::SocketShutdownWakesWaiters}.
#   class BasicSocket < IO; end

# BasicSocket has a close_read and close_write of its own, which close the descriptor once both
# directions are shut down: they must wake the waiters first too (ext/evt/closers.c).
BasicSocket.prepend(Evt::SocketShutdownWakesWaiters) if defined?(Evt::SocketShutdownWakesWaiters)

module Evt
  # IO.popen's block form closes the IO when the block ends by Ruby's own close, past IO#close and
  # so past evt's check: a fiber still reading the IO was never woken (a hang at the loop's end), or
  # on Ruby 4.0, with the block on the thread's blocking fiber, Ruby's close waited for that fiber
  # while the loop could not run it. The IO is closed through IO#close when the block ends; Ruby's
  # close then finds it closed, and the child has been waited for ($?) as before.
  # @api private
  module PopenClosesThroughIOClose
    # IO.popen; with a block, its IO closed through IO#close at the block's end.
    def popen(*arguments, **options, &block)
      return super unless block

      super(*arguments, **options) do |io|
        yield io
      ensure
        io.close if io && !io.closed? # nil: the child of popen("-")
      end
    end
  end
end
IO.singleton_class.prepend(Evt::PopenClosesThroughIOClose)
require_relative "evt/buffer_warning"
require_relative "evt/blocking_pool"
require_relative "evt/insight"
require_relative "evt/stall_watch"
require_relative "evt/scheduler"
require_relative "evt/socket_write"
require_relative "evt/selector" if Evt.extension? # the loop behind io-event's selector interface (evt/async)

# evt: a Fiber Scheduler for CRuby on the fastest event mechanism the platform has (io_uring,
# epoll, kqueue, poll or select, in C; a loop written in Ruby over IO.select where the C extension
# is not loaded).
#
# Where to start:
# - {Evt.run}: runs a block with a scheduler on the current thread, until its fibers are done;
# - {Evt::Scheduler}: the Fiber::Scheduler itself, for Fiber.set_scheduler, with its options
#   (`backend:`, `pool_size:`);
# - {Evt::Workers}: one event loop per core, in worker processes or Ractors, supervised;
# - {Evt::Selector}: evt's loop under async and Falcon (`require "evt/async"`);
# - {Evt::HOOKS}: every hook evt answers, and where.
#
# Errors: evt defines no exception classes of its own. A scheduled fiber gets the error Ruby
# raises for the same call without a scheduler (IOError for an IO closed while a fiber waits on
# it, IO::TimeoutError, Timeout::Error...). Misuse raises ArgumentError or TypeError (an unknown
# backend, a bad option), FiberError (the loop run or closed from a scheduled fiber) or
# ThreadError (a scheduler with waiting fibers used from another thread).
#
# @example Two sleeps at once
#   Evt.run do
#     Fiber.schedule { sleep 1 }
#     Fiber.schedule { sleep 1 }
#   end # about a second, not two
module Evt
  # Runs the block in a non-blocking fiber on a new {Scheduler} set for the current thread, runs
  # the loop until every fiber has finished, then restores the thread's previous scheduler.
  #
  # Called from inside a scheduled fiber, the block simply runs there: the thread already has a
  # scheduler.
  #
  # If the loop itself is interrupted (Ctrl-C, exit, Thread#raise), the fibers still waiting are
  # killed, their ensure clauses running, and the interruption goes on.
  #
  # @example A server and a client on one thread
  #   Evt.run do
  #     server = TCPServer.new("127.0.0.1", 0)
  #     Fiber.schedule do
  #       client = server.accept
  #       client.puts "hello, #{client.gets.chomp}"
  #       client.close
  #     end
  #     TCPSocket.open("127.0.0.1", server.addr[1]) do |socket|
  #       socket.puts "ann"
  #       socket.gets # => "hello, ann\n"
  #     end
  #   end
  # @example Choosing the backend
  #   Evt.run(backend: :epoll) { Fiber.current_scheduler.backend } # => :epoll
  #
  # @example Stall reports on
  #   Evt.run(stall: 0.1) { sleep 0.01 } # a fiber holding the thread 100 ms would be reported
  #
  # @param backend [Symbol, String, nil] the event mechanism; nil: the default (see
  #   {Scheduler#initialize})
  # @param options [Hash] the scheduler's other options: pool_size:, stall:, on_stall:, profiler:
  #   (see {Scheduling#initialize})
  # @yieldreturn [Object] the value {run} returns
  # @return [Object] the block's value
  # @raise [Exception] the exception that ended the block, raised here once the loop is done
  # @raise [ArgumentError] no block, or an unknown backend
  def self.run(backend: nil, **options, &block)
    raise ArgumentError, "Evt.run needs a block" unless block

    current = Fiber.scheduler
    return yield if current && !Fiber.current.blocking?

    scheduler = Scheduler.new(backend: backend, **options)
    outcome = nil
    Fiber.set_scheduler(scheduler)
    begin
      Fiber.schedule do
        outcome = [:value, block.call]
      rescue SystemExit, SignalException
        raise
      rescue Exception => error # rubocop:disable Lint/RescueException -- re-raised by Evt.run
        outcome = [:error, error]
      end
      scheduler.run
    rescue Exception # rubocop:disable Lint/RescueException
      # The loop itself was interrupted (Ctrl-C, exit, Thread#raise): end the other fibers the way
      # Ruby ends a process's other threads, running their ensure clauses.
      scheduler.kill_all
      raise
    ensure
      Fiber.set_scheduler(current)
    end
    raise outcome[1] if outcome&.first == :error

    outcome&.last
  end
end
