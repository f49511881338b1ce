# frozen_string_literal: true

# async and Falcon on evt's loop: defines IO::Event::Selector::Evt, the selector io-event's
# IO::Event::Selector.new makes when IO_EVENT_SELECTOR=Evt, or that a scheduler takes directly:
#
#   require "evt/async"
#   Async::Scheduler.new(selector: IO::Event::Selector::Evt.new(Fiber.current))
#
# A server started by a command (falcon serve): RUBYOPT="-revt/async" IO_EVENT_SELECTOR=Evt.
require "evt"
require "io/event"

unless Evt.extension?
  raise LoadError, "evt/async needs evt's C extension, which is not loaded (#{Evt::EXTENSION_MISSING}); " \
                   "async's own IO::Event::Selector::Select is the pure-Ruby choice there"
end

module Evt
  # evt's loop, backends and IO hooks behind the interface io-event's selectors give async
  # (ext/evt/selector.c; the C methods' own comments say what each does). The fibers async runs are
  # suspended in evt's loop as {Scheduler}'s are; async keeps its timers and turns the loop by calling
  # #select. Defined on the C extension's Evt::Selector, a subclass of Evt::Loop.
  class Selector
    include ProcessWaiting

    # @param loop [Fiber] the fiber that calls #select (async's: Fiber.current when it makes the selector)
    # @param backend [Symbol, String, nil] one of Evt::Loop.backends; nil: EVT_BACKEND from the
    #   environment if set, else the fastest available
    # @raise [ArgumentError] the backend is unknown or cannot run here (the pure-Ruby one included)
    def initialize(loop, backend: nil)
      name = Scheduler.send(:choose_backend, backend)
      raise ArgumentError, "evt: the selector runs on the C backends only (#{Loop.backends.join(", ")})" unless Loop.backends.include?(name)

      super(name)
      become_selector(loop)
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
  end
end

class IO
  module Event
    module Selector
      Evt = ::Evt::Selector
    end
  end
end
