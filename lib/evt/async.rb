# frozen_string_literal: true

# async and Falcon on evt's loop: defines IO::Event::Selector::Evt, the selector io-event's
# IO::Event::Selector.new makes when IO_EVENT_SELECTOR=Evt, or that a scheduler takes directly:
#
#   require "evt/async"
#   Async::Scheduler.new(selector: IO::Event::Selector::Evt.new(Fiber.current))
#
# A server started by a command (falcon serve): RUBYOPT="-revt/async" IO_EVENT_SELECTOR=Evt.
require "evt"
require "io/event" # the io-event gem, which async depends on

unless Evt.extension?
  raise LoadError, "evt/async needs evt's C extension, which is not loaded (#{Evt::EXTENSION_MISSING}); " \
                   "async's own IO::Event::Selector::Select is the pure-Ruby choice there"
end

class IO
  # The io-event gem's namespace: the event loop interface async runs on.
  module Event
    # io-event's selectors: IO::Event::Selector.new makes the one IO_EVENT_SELECTOR names.
    module Selector
      # evt's loop as an io-event selector: {::Evt::Selector} under the name io-event looks up
      # (IO_EVENT_SELECTOR=Evt), or for async's scheduler to take directly.
      #
      # @example Every scheduler async makes, on evt's loop (the constant must exist before async
      #   makes its first one, hence RUBYOPT for a command)
      #   IO_EVENT_SELECTOR=Evt RUBYOPT="-revt/async" falcon serve
      # @example One scheduler of async's, given the selector
      #   require "evt/async"
      #   Async::Scheduler.new(selector: IO::Event::Selector::Evt.new(Fiber.current))
      Evt = ::Evt::Selector
    end
  end
end
