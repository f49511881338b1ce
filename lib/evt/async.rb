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
  module Event
    module Selector
      Evt = ::Evt::Selector
    end
  end
end
