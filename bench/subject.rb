# frozen_string_literal: true

# What a bin/bench subject means inside a scenario process. Every Ruby scenario is written once,
# with Fiber.schedule, and runs under the subject's scheduler:
#
#   evt-<backend>   Evt.run(backend: <backend>)
#   evt-<backend>-stall  the same with stall reports on (100 ms), which nothing trips
#   evt-<backend>-stats  the same with a fiber reading scheduler.stats once a second
#   async-epoll     the async gem on io-event's EPoll selector
#   async-uring     the async gem on io-event's URing selector
#   carbon          Carbon Fiber's scheduler (the carbon_fiber gem; Ruby >= 3.4, io_uring)
#   uringmachine    uringmachine's fiber scheduler (the uringmachine gem; Ruby >= 4.0, io_uring)
#
# `blocking`, `fibers` and `threads` have no scheduler; scenarios handle them in their own way.
module Bench
  module Subject
    # The insight subjects' suffixes: what evt runs besides the scenario.
    INSIGHT = { "stall" => "stall reports on, threshold 100 ms", "stats" => "scheduler.stats read once a second" }.freeze

    module_function

    def fibers?(subject)
      subject.start_with?("evt-", "async-") || %w[carbon uringmachine].include?(subject)
    end

    # Runs the block on the subject's scheduler until every fiber it scheduled has finished.
    def run(subject, &block)
      case subject
      when /\Aevt-(\w+)\z/
        require "evt"
        Evt.run(backend: Regexp.last_match(1), &block)
      when /\Aevt-(\w+)-stall\z/
        require "evt"
        run_scheduler(Evt::Scheduler.new(backend: Regexp.last_match(1), stall: 0.1), &block)
      when /\Aevt-(\w+)-stats\z/
        require "evt"
        run_scheduler(Evt::Scheduler.new(backend: Regexp.last_match(1))) { with_stats_reader(&block) }
      when /\Aasync-(epoll|uring)\z/
        ENV["IO_EVENT_SELECTOR"] = Regexp.last_match(1) == "epoll" ? "EPoll" : "URing"
        require "async"
        Async(&block).wait
      when "carbon", "uringmachine"
        Fiber.set_scheduler(peer_scheduler(subject))
        begin
          Fiber.schedule(&block)
        ensure
          Fiber.set_scheduler(nil) # runs the loop until every fiber has finished
        end
      else
        raise ArgumentError, "#{subject} has no scheduler"
      end
    end

    # Runs the block in a fiber of `scheduler`, then the loop until every fiber has finished.
    def run_scheduler(scheduler, &block)
      Fiber.set_scheduler(scheduler)
      begin
        Fiber.schedule(&block)
      ensure
        Fiber.set_scheduler(nil)
      end
    end

    # Runs the block while another fiber reads Fiber.scheduler.stats once a second, as an exporter
    # would.
    def with_stats_reader
      stop = Thread::Queue.new
      Fiber.schedule do
        until stop.closed?
          stop.pop(timeout: 1)
          Fiber.scheduler.stats
        end
      end
      yield
    ensure
      stop&.close
    end

    # A Fiber Scheduler of a peer that runs as one (set, then unset to run the loop to its end).
    def peer_scheduler(subject)
      if subject == "carbon"
        require "carbon_fiber"
        CarbonFiber::Scheduler.new
      else
        require "uringmachine"
        require "uringmachine/fiber_scheduler"
        UM::FiberScheduler.new(UM.new)
      end
    end

    # Peak and current resident set size of this process, in MB.
    def rss_mb(field = "VmRSS")
      File.read("/proc/self/status")[/^#{field}:\s+(\d+) kB/, 1].to_i / 1024.0
    end
  end
end
