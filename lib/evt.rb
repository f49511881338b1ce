# frozen_string_literal: true

require_relative "evt/version"
require_relative "evt/hooks"

module Evt
  # Loads the C extension (Evt::Loop and its backends); nil when it is loaded, else why not. Where
  # it cannot be built or loaded (no compiler, JRuby, TruffleRuby, Windows), evt runs on the
  # pure-Ruby select backend; EVT_NO_EXTENSION=1 asks for that path.
  def self.load_extension
    return "EVT_NO_EXTENSION=1" if ENV["EVT_NO_EXTENSION"] == "1"

    begin
      require "evt/#{RUBY_VERSION[/\A\d+\.\d+/]}/evt" # a development build (rake compile)
    rescue LoadError
      require "evt/evt" # the installed gem's build
    end
    nil
  rescue LoadError => e
    e.message
  end
  private_class_method :load_extension

  # The pure-Ruby loop: loaded at its first use (without the extension, at once).
  autoload :SelectLoop, File.expand_path("evt/select_loop", __dir__)

  # Why the C extension is not in use, or nil when it is.
  EXTENSION_MISSING = load_extension
  if EXTENSION_MISSING
    warn "evt: the C extension is not loaded (#{EXTENSION_MISSING}): using the pure-Ruby select backend" \
      unless ENV["EVT_NO_EXTENSION"] == "1"
    # The loop Evt::Scheduler runs on: the select loop, where the extension would have put its own.
    class Loop < SelectLoop; end
  end

  # @return [Boolean] whether the C extension (io_uring, epoll and poll backends) is loaded.
  def self.extension?
    EXTENSION_MISSING.nil?
  end
end

module Evt
  # Ruby releases with a bug of their own that evt's users meet: what it is, and what to take instead.
  RUBY_BUGS = {
    "3.4.10" => "3.4.9", "4.0.4" => "4.0.3", "4.0.5" => "4.0.3", "4.0.6" => "4.0.3",
  }.transform_values do |before|
    "a use-after-free in fiber switching (Ruby Bug #22196, fixed by ruby/ruby#17957): " \
      "use #{before}, or a later release with the fix"
  end.freeze

  # The warning for Ruby +version+, or nil when evt knows of no bug of it.
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

# BasicSocket has a close_read and close_write of its own, which close the descriptor once both
# directions are shut down: they must wake the waiters first too (ext/evt/close.c).
BasicSocket.prepend(Evt::SocketShutdownWakesWaiters) if defined?(Evt::SocketShutdownWakesWaiters)
require_relative "evt/worker_pool"
require_relative "evt/scheduler"
require_relative "evt/socket_write"
require_relative "evt/selector" if Evt.extension? # the loop behind io-event's selector interface (evt/async)

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
