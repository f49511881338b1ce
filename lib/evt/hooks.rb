# frozen_string_literal: true

module Evt
  # One Fiber::Scheduler hook evt answers: the call Ruby makes, where evt answers it, and which
  # Rubies make it. An entry of {HOOKS}.
  #
  # @!attribute [rw] call
  #   @return [String] the call Ruby makes, with its arguments, starting with the hook's name
  # @!attribute [rw] where
  #   @return [String] where evt answers it: "C, <file>" for the C loop (ext/evt/), else the Ruby
  #     file, with a note on how
  # @!attribute [rw] rubies
  #   @return [String] the first Ruby that calls it, as "3.3+"
  Hook = Struct.new(:call, :where, :rubies, keyword_init: true) do
    # @return [String] one line of the table `puts Evt::HOOKS.values` prints
    def to_s
      format("%-80s %-5s %s", call, rubies, where)
    end
  end

  # Every hook evt answers, listed once: hook name => {Hook}. The table in docs/hooks.md is
  # generated from it (bin/docs), {Scheduler}'s documentation points here, and
  # test/hooks_list_test.rb checks that both loops answer each hook listed.
  # "C" is the C loop (ext/evt/); on the pure-Ruby loop ({SelectLoop}) each of those is Ruby.
  #
  # @example Print the table
  #   ruby -Ilib -revt -e 'puts Evt::HOOKS.values'
  # @example Which Rubies call a hook
  #   Evt::HOOKS[:blocking_operation_wait].rubies # => "3.4+"
  HOOKS = {
    io_wait: Hook.new(call: "io_wait(io, events, timeout)", where: "C, io.c", rubies: "3.3+"),
    io_read: Hook.new(call: "io_read(io, buffer, length, offset); 4.1: (io, buffer, offset, length)",
                      where: "C, io.c: one transfer primitive under both conventions", rubies: "3.3+"),
    io_write: Hook.new(call: "io_write(io, buffer, length, offset); 4.1: (io, buffer, offset, length)",
                       where: "C, io.c", rubies: "3.3+"),
    io_pread: Hook.new(call: "io_pread(io, buffer, from, length, offset); 4.1: (.., from, offset, length)",
                       where: "C, io.c (the pure-Ruby loop: from 4.0)", rubies: "3.3+"),
    io_pwrite: Hook.new(call: "io_pwrite(io, buffer, from, length, offset); 4.1: (.., from, offset, length)",
                        where: "C, io.c; 3.3 and 3.4 call it without the GVL (the pure-Ruby loop: from 4.0)",
                        rubies: "3.3+"),
    io_select: Hook.new(call: "io_select(readables, writables, exceptables, timeout)", where: "C, hooks.c, no thread",
                        rubies: "3.3+"),
    kernel_sleep: Hook.new(call: "kernel_sleep(duration = nil)", where: "C, hooks.c", rubies: "3.3+"),
    block: Hook.new(call: "block(blocker, timeout = nil)", where: "C, hooks.c", rubies: "3.3+"),
    unblock: Hook.new(call: "unblock(blocker, fiber)", where: "C, hooks.c, from any thread", rubies: "3.3+"),
    timeout_after: Hook.new(call: "timeout_after(duration, exception_class, *arguments)",
                            where: "C, hooks.c, on the timer heap", rubies: "3.3+"),
    process_wait: Hook.new(call: "process_wait(pid, flags)",
                           where: "scheduler.rb: waitid in the ring, EVFILT_PROC, a pidfd, else a thread", rubies: "3.3+"),
    address_resolve: Hook.new(call: "address_resolve(hostname)", where: "scheduler.rb: Resolver's threads",
                              rubies: "3.3+"),
    blocking_operation_wait: Hook.new(call: "blocking_operation_wait(work)",
                                      where: "scheduler.rb: WorkerPool's threads", rubies: "3.4+"),
    fiber: Hook.new(call: "fiber(**options, &block)", where: "scheduler.rb", rubies: "3.3+"),
    scheduler_close: Hook.new(call: "scheduler_close", where: "C, evt.c, keeps $! intact", rubies: "3.3+"),
    close: Hook.new(call: "close", where: "scheduler.rb", rubies: "3.3+"),
    io_close: Hook.new(call: "io_close(fd)", where: "C, hooks.c: close(2) at once, waking the waits Ruby does not track", rubies: "4.0+"),
    fiber_interrupt: Hook.new(call: "fiber_interrupt(fiber, exception)",
                              where: "C, hooks.c, from any thread; a Fiber or a stand-in", rubies: "4.0+"),
    yield: Hook.new(call: "yield", where: "scheduler.rb: lets the ready fibers run (as sleep(0))", rubies: "4.0+"),
  }.freeze

  # The hooks of {HOOKS} that the pure-Ruby loop leaves to Ruby itself on this Ruby: io_pread and
  # io_pwrite before Ruby 4.0, which calls io_pwrite without the GVL, where no Ruby code may run
  # (both are on files, which never wait).
  RUBY_LOOP_LEAVES = (RUBY_VERSION >= "4" ? [] : %i[io_pread io_pwrite]).freeze
end
