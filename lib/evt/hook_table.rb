# frozen_string_literal: true

module Evt
  # One Fiber::Scheduler hook evt answers: the call Ruby makes, which Rubies make it, and where evt
  # answers it: the loop's half (`c`, a file of ext/evt; on the pure-Ruby loop, that loop) and the
  # half written in Ruby (`ruby`, a file of lib/evt, with the Ruby series it exists on in
  # parentheses when not all). A hook split between the two names both. An entry of {HOOKS}.
  #
  # @!attribute [rw] call
  #   @return [String] the call Ruby makes, with its arguments, starting with the hook's name
  # @!attribute [rw] rubies
  #   @return [String] the first Ruby that calls it, as "3.3+"
  # @!attribute [rw] c
  #   @return [String, nil] the C file of the loop's half (ext/evt/), or nil
  # @!attribute [rw] ruby
  #   @return [String, nil] the Ruby file of the half written in Ruby (lib/evt/), or nil
  # @!attribute [rw] note
  #   @return [String, nil] how, in a few words
  Hook = Struct.new(:call, :rubies, :c, :ruby, :note, keyword_init: true) do
    # @return [String] where evt answers it, as the table says it: "C, io.c + scheduler.rb (3.3): ..."
    def where
      halves = [c && "C, #{c}", ruby].compact.join(" + ")
      note ? "#{halves}: #{note}" : halves
    end

    # @param series [String] a Ruby series, as "3.4"
    # @return [Boolean] whether the half written in Ruby exists on that series
    def ruby_on?(series)
      return false unless ruby

      only = ruby[/\((.+)\)/, 1]
      only.nil? || only.split(/,\s*/).include?(series)
    end

    # @return [String] one line of the table `puts Evt::HOOKS.values` prints
    def to_s
      format("%-80s %-5s %s", call, rubies, where)
    end
  end

  # Every hook evt answers, listed once: hook name => {Hook}. The table in docs/hooks.md is
  # generated from it (bin/docs), {Scheduler}'s documentation points here, and
  # test/hooks_list_test.rb checks each half against the methods' owners (Evt::Loop for the C half,
  # {Scheduling} for the Ruby one) and that the pure-Ruby loop answers what the C half does.
  #
  # @example Print the table
  #   ruby -Ilib -revt -e 'puts Evt::HOOKS.values'
  # @example Which Rubies call a hook
  #   Evt::HOOKS[:blocking_operation_wait].rubies # => "3.4+"
  HOOKS = {
    io_wait: Hook.new(call: "io_wait(io, events, timeout)", rubies: "3.3+", c: "io.c", ruby: "scheduler.rb (3.3)",
                      note: "Ruby 3.3 gets IO::TimeoutError from the Ruby half"),
    io_read: Hook.new(call: "io_read(io, buffer, length, offset); 4.1: (io, buffer, offset, length)", rubies: "3.3+",
                      c: "io.c",
                      note: "one transfer primitive under both conventions; on 4.0, a read Ruby retries goes to io_wait (on io_uring IO#read(length) alone)"),
    io_write: Hook.new(call: "io_write(io, buffer, length, offset); 4.1: (io, buffer, offset, length)", rubies: "3.3+",
                       c: "io.c"),
    io_pread: Hook.new(call: "io_pread(io, buffer, from, length, offset); 4.1: (.., from, offset, length)",
                       rubies: "3.3+", c: "io.c", note: "the pure-Ruby loop: from 4.0"),
    io_pwrite: Hook.new(call: "io_pwrite(io, buffer, from, length, offset); 4.1: (.., from, offset, length)",
                        rubies: "3.3+", c: "io.c",
                        note: "3.3 and 3.4 call it without the GVL (the pure-Ruby loop: from 4.0)"),
    io_select: Hook.new(call: "io_select(readables, writables, exceptables, timeout)", rubies: "3.3+", c: "hooks.c",
                        note: "no thread"),
    kernel_sleep: Hook.new(call: "kernel_sleep(duration = nil)", rubies: "3.3+", c: "hooks.c"),
    block: Hook.new(call: "block(blocker, timeout = nil)", rubies: "3.3+", c: "hooks.c"),
    unblock: Hook.new(call: "unblock(blocker, fiber)", rubies: "3.3+", c: "hooks.c", note: "from any thread"),
    timeout_after: Hook.new(call: "timeout_after(duration, exception_class, *arguments)", rubies: "3.3+",
                            c: "hooks.c", ruby: "scheduler.rb",
                            note: "a timer on the loop's heap; Timeout::Error raised as Ruby does it"),
    process_wait: Hook.new(call: "process_wait(pid, flags)", rubies: "3.3+", ruby: "scheduler.rb",
                           note: "waitid in the ring, EVFILT_PROC, a pidfd, else a thread"),
    address_resolve: Hook.new(call: "address_resolve(hostname)", rubies: "3.3+", ruby: "scheduler.rb",
                              note: "the Resolver's threads"),
    blocking_operation_wait: Hook.new(call: "blocking_operation_wait(work)", rubies: "3.4+", ruby: "scheduler.rb",
                                      note: "the BlockingPool's threads"),
    fiber: Hook.new(call: "fiber(**options, &block)", rubies: "3.3+", ruby: "scheduler.rb"),
    scheduler_close: Hook.new(call: "scheduler_close", rubies: "3.3+", c: "evt.c", ruby: "scheduler.rb",
                              note: "keeps $! intact; the Ruby half closes the pools"),
    close: Hook.new(call: "close", rubies: "3.3+", ruby: "scheduler.rb"),
    io_close: Hook.new(call: "io_close(fd)", rubies: "4.0+", c: "hooks.c",
                       note: "close(2) at once, waking the waits Ruby does not track"),
    fiber_interrupt: Hook.new(call: "fiber_interrupt(fiber, exception)", rubies: "4.0+", c: "hooks.c",
                              note: "from any thread; a Fiber or a stand-in"),
    yield: Hook.new(call: "yield", rubies: "4.0+", ruby: "scheduler.rb", note: "lets the ready fibers run (as sleep(0))"),
  }.freeze

  # The hooks of {HOOKS} that the pure-Ruby loop leaves to Ruby itself on this Ruby: io_pread and
  # io_pwrite before Ruby 4.0, which calls io_pwrite without the GVL, where no Ruby code may run
  # (both are on files, which never wait).
  RUBY_LOOP_LEAVES = (RUBY_VERSION >= "4" ? [] : %i[io_pread io_pwrite]).freeze
end
