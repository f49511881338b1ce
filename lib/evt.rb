# frozen_string_literal: true

require_relative "evt/version"
begin
  require "evt/#{RUBY_VERSION[/\A\d+\.\d+/]}/evt" # a development build (rake compile)
rescue LoadError
  require "evt/evt" # the installed gem's build
end
require_relative "evt/resolver"
require_relative "evt/scheduler"

# evt: a Fiber Scheduler for CRuby on the fastest event mechanism the platform has.
#
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
  # @param backend [Symbol, String, nil] see {Scheduler#initialize}
  # @return the block's value; an exception from the block is raised here, once the loop is done.
  def self.run(backend: nil, &block)
    raise ArgumentError, "Evt.run needs a block" unless block

    current = Fiber.scheduler
    return yield if current && !Fiber.current.blocking?

    scheduler = Scheduler.new(backend: backend)
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
