# frozen_string_literal: true

module Evt
  # evt's loop, backends and IO hooks behind the interface io-event's selectors give async
  # (ext/evt/selector.c, whose methods' comments say what each does; lib/evt/async.rb names it
  # IO::Event::Selector::Evt). The fibers async runs are suspended in evt's loop as {Scheduler}'s are;
  # async keeps its timers and turns the loop by calling #select. A face over an {Evt::Loop} it makes
  # and holds (not a subclass of it); only where the extension is loaded.
  class Selector
    include ProcessWaiting

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

    # Ruby 4.0's io_close hook, as io-event's selectors answer it: wakes what waits on +fd+ and closes
    # it (through the ring on io_uring).
    # @param fd [Integer]
    # @return [Boolean] true: +fd+ is closed
    def io_close(fd)
      loop_object.io_close(fd)
    end

    # Process.wait and friends: waits for +pid+ without blocking the loop (see {ProcessWaiting}).
    # @return [Process::Status]
    def process_wait(_fiber, pid, flags)
      super(pid, flags)
    end

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
