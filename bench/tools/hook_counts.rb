# frozen_string_literal: true

# Loaded into a bench server (ruby -r) by bench/tools/http_redis_split.rb --hooks: counts the Fiber
# Scheduler hooks Ruby calls on the first scheduler the process sets, ConditionVariable#wait (a
# connection pool's waits), and connection_pool's checkouts by how often each waited (pop_w0: got a
# connection at once; pop_w3: waited three times or more, woken each time by a connection another
# checkout took first), and prints them on stdout as "hook counts {name => count}" for each
# line it reads on stdin (a thread of its own reads: a trap handler might wait for the scheduler's
# kernel wait to end). The counting wrappers cost time: the tool measures without them.
module HookCounts
  COUNTS = Hash.new(0)
  HOOKS = %i[block unblock io_wait io_read io_write kernel_sleep io_select].freeze

  # Prepended to the scheduler: each hook counted, then run.
  module Counting
    HOOKS.each do |name|
      define_method(name) do |*arguments, **keywords, &block|
        COUNTS[name] += 1
        super(*arguments, **keywords, &block)
      end
    end
  end

  # Prepended to Fiber's singleton class: the first scheduler set gets Counting.
  module SetScheduler
    def set_scheduler(scheduler)
      scheduler.singleton_class.prepend(Counting) if scheduler && !scheduler.singleton_class.include?(Counting)
      # (The server built its pool before: connection_pool is loaded by now if it is used.)
      ConnectionPool::TimedStack.prepend(Checkouts) if defined?(ConnectionPool::TimedStack) && !ConnectionPool::TimedStack.include?(Checkouts)
      super
    end
  end

  # Prepended to Thread::ConditionVariable.
  module Waits
    def wait(...)
      COUNTS[:pool_wait] += 1
      Fiber[:hook_counts_waits] += 1 if Fiber[:hook_counts_waits]
      super
    end
  end

  # Prepended to ConnectionPool::TimedStack: each checkout counted by its waits.
  module Checkouts
    def pop(...)
      Fiber[:hook_counts_waits] = 0
      super
    ensure
      COUNTS[:"pop_w#{[Fiber[:hook_counts_waits], 3].min}"] += 1
      Fiber[:hook_counts_waits] = nil
    end
  end
end

Fiber.singleton_class.prepend(HookCounts::SetScheduler)
Thread::ConditionVariable.prepend(HookCounts::Waits)
Thread.new do
  while $stdin.gets
    $stdout.puts "hook counts #{HookCounts::COUNTS.sort.to_h.inspect}"
    $stdout.flush
  end
end
