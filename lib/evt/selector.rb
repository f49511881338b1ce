# frozen_string_literal: true

module Evt
  # evt's loop, backends and IO hooks behind the interface io-event's selectors give async
  # (`require "evt/async"` names it IO::Event::Selector::Evt). The fibers async runs are suspended
  # in evt's loop as {Scheduler}'s are; async keeps its timers and turns the loop by calling
  # {#select}. A face over an {Evt::Loop} it makes and holds (not a subclass of it); only where the
  # extension is loaded. Most of its methods are defined in C (ext/evt/selector.c), documented
  # there.
  #
  # Its methods are io-event's selector interface, which async calls; code running on async does
  # not call them.
  #
  # @example async's scheduler on evt's loop
  #   require "evt/async"
  #   selector = IO::Event::Selector::Evt.new(Fiber.current, backend: :epoll)
  #   Async::Scheduler.new(selector: selector)
  class Selector
    include ProcessWaiting

    # A selector on a new loop of its own, for the fiber `loop`.
    # @param loop [Fiber] the fiber that calls #select (async's: Fiber.current when it makes the selector)
    # @param backend [Symbol, String, nil] one of Evt::Loop.backends; nil: EVT_BACKEND from the
    #   environment if set, else the fastest available
    # @raise [ArgumentError] the backend is unknown or cannot run here (the pure-Ruby one included)
    def initialize(loop, backend: nil)
      name = Scheduler.send(:choose_backend, backend)
      raise ArgumentError, "evt: the selector runs on the C backends only (#{Loop.backends.join(", ")})" unless Loop.backends.include?(name)

      attach(Loop.new(name), loop)
    end

    # @return [Symbol] the backend the loop runs on
    def backend
      loop_object.backend
    end

    # Ruby 4.0's io_close hook, as io-event's selectors answer it: wakes what waits on `fd` and closes
    # it.
    # @param fd [Integer]
    # @return [Boolean] true: `fd` is closed
    def io_close(fd)
      loop_object.io_close(fd)
    end

    # Process.wait and friends: waits for `pid` without blocking the loop (see {ProcessWaiting}).
    # @param _fiber [Fiber] the waiting fiber (the current one)
    # @param pid [Integer]
    # @param flags [Integer]
    # @return [Process::Status]
    def process_wait(_fiber, pid, flags)
      super(pid, flags)
    end

    # @return [String] the class, the backend, and whether it is closed
    def inspect
      "#<#{self.class} #{backend}#{closed? ? " closed" : ""}>"
    end

    private

    def wait_readable(io)
      io_wait(Fiber.current, io, IO::READABLE)
    end

    # ProcessWaiting's ways to the loop.
    def wait_child_exit(pid)
      loop_object.__send__(:wait_child_exit, pid)
    end

    def pidfd_open(pid)
      loop_object.__send__(:pidfd_open, pid)
    end
  end
end
