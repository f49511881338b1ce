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
  # (`backend: :select`, {SelectScheduler}) everywhere else. Loaded only then: `require "evt"` with
  # the extension does not load it. The schedulers sit on it as {Scheduler} sits on the C loop,
  # sharing the hooks written in Ruby ({Scheduling}).
  #
  # It follows the C core's files (lib/evt/select_loop/*.rb, each named after its C counterpart),
  # with Ruby objects where the C core has structs: a {Waiter} per suspension, a {Timers} heap, a
  # hash of the IOs waited on, a self-pipe for wakeups from other threads. One loop iteration: serve
  # the other threads' requests, resume the ready fibers, wait in IO.select (without the GVL) for
  # every watched IO and the wakeup pipe, mark the waiters whose IOs are ready, fire the due timers.
  # The behaviour both loops share is pinned by the same tests (every test runs on both), not by
  # mirroring: what this loop does not offer is in the README's "Backends".
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
  #
  # Its public methods are those of {Evt::Loop}, with the same contracts: the hooks Ruby calls, and
  # what code driving a scheduler calls ({#run}, {#wakeup}, {#backend}...).
  class SelectLoop
    # The one backend of this loop.
    # @api private
    BACKENDS = [:select].freeze

    # This Ruby's scheduler interface (RUBY_FIBER_SCHEDULER_VERSION, which the C loop binds at compile
    # time and Ruby code cannot see): from the header Ruby installed, where there is one; else 4 from
    # Ruby 4.1, the first with interface 4 (a 4.1 development build may still have 3).
    # @api private
    INTERFACE = begin
      header = File.join(RbConfig::CONFIG["rubyhdrdir"], "ruby", "fiber", "scheduler.h")
      Integer(File.read(header)[/^#define RUBY_FIBER_SCHEDULER_VERSION (\d+)/, 1])
    rescue StandardError
      RUBY_VERSION >= "4.1" ? 4 : 3
    end
    # The events io_wait knows; others are dropped.
    # @api private
    EVENTS = IO::READABLE | IO::PRIORITY | IO::WRITABLE
    # The longest timeout, in nanoseconds (73 years): longer ones are this one, as in C.
    # @api private
    FOREVER = 2**61

    # What a finished wait reports besides events (> 0) and "unblocked" (1), as in loop.h: resumed
    # for nothing (woken without its events, or yielding).
    # @api private
    SPURIOUS = 0
    # A finished wait's report: its time ran out.
    # @api private
    TIMED_OUT = -1
    # A finished wait's report: its IO was closed under it.
    # @api private
    CLOSED = -2
    # Starters that may go to the head of the ready queue in a turn, at the least (EVT_FIRST_MIN).
    # @api private
    FIRST_MIN = 64

    # @return [Array<Symbol>] the backends of this loop: [:select]
    def self.backends
      BACKENDS
    end

    # Whether the backend `name` can run on this loop.
    # @param name [Symbol, String]
    # @return [String, nil] nil when `name` can run here, else why not
    # @raise [TypeError] `name` is not a Symbol or String
    def self.probe(name)
      BACKENDS.include?(backend_name(name)) ? nil : "unknown backend"
    end

    # @param name [Symbol, String]
    # @return [nil] the pure-Ruby loop emulates nothing
    # @raise [TypeError] `name` is not a Symbol or String
    def self.emulation(name)
      backend_name(name)
      nil
    end

    def self.backend_name(name)
      unless name.is_a?(Symbol) || name.is_a?(String)
        raise TypeError, "evt: backend name must be a Symbol or String, not #{name.class}"
      end

      name.to_sym
    end
    private_class_method :backend_name
  end
end

require_relative "select_loop/timers"
require_relative "select_loop/waiter"
require_relative "select_loop/object"
require_relative "select_loop/close"
require_relative "select_loop/hooks"
require_relative "select_loop/io"
require_relative "select_loop/loop"
