# frozen_string_literal: true

# How deep a waiting fiber's machine stack goes, by what it waits in, under evt: the bytes from the
# top of the fiber's stack to the deepest point of its switch away, and how many 4 KiB pages that
# touches (each one is RSS of every fiber waiting so, and what the GC scans of it). Split in three:
# Ruby's frames above evt (from the fiber's block to the hook), evt's own frames (those in evt.so),
# and Ruby's below them (rb_ensure, the switch itself). gdb stops a fiber at its switch
# (coroutine_transfer) and walks its frames. The program starts WAITERS fibers in the same wait, each
# on a socket of its own, and the last one is measured: the first ones run Ruby's interpreter, and
# YJIT compiles the block after some calls, which changes Ruby's frames above the hook (on Ruby 3.4
# a read's stack is 4,136 bytes deep interpreted and within one page compiled). Then it ends them.
#
#   ruby [--yjit] bench/tools/wait_stack_depth.rb [BACKEND] [KIND ...]   (epoll; every kind)
#   WAITERS=1 ruby ...   the first fiber instead (default 200)
#
# KIND: sleep, wait_readable, gets, read (IO#read(1)), readpartial. Needs gdb, and Ruby's symbols
# (a Ruby built with -g, as bin/setup's are). bench/tools/fiber_memory_by_wait.rb measures the same
# through RSS.
require "rbconfig"
require "tmpdir"

KINDS = {
  # kind => [the wait (on a, a socket of its own), a function on the waiting fiber's stack that says
  # it is this wait]
  "sleep" => ["sleep", "rb_f_sleep"],
  "wait_readable" => ["a.wait_readable", "io_wait_readable"],
  "gets" => ["a.gets", "rb_io_gets_m"],
  "read" => ["a.read(1)", "io_read"],
  "readpartial" => ["a.readpartial(10)", "io_readpartial"]
}.freeze
PAGE = 4096
SWITCH_PUSH = 48 # what coroutine_transfer pushes below the point gdb stops at (callee-saved registers)

backend = ARGV.first && !KINDS.key?(ARGV.first) ? ARGV.shift : "epoll"
kinds = ARGV.empty? ? KINDS.keys : ARGV
unknown = kinds - KINDS.keys
abort "wait_stack_depth: KIND is one of #{KINDS.keys.join(", ")}; not #{unknown.join(", ")}" unless unknown.empty?
abort "wait_stack_depth: needs gdb, which is not installed here" unless system("command -v gdb >/dev/null 2>&1")

# Run inside gdb: at every switch, the frames of the switching fiber; the COUNTth whose stack holds
# MARKER is printed as "name sp in_evt" lines, newest first, and the program stops there.
WALKER = <<~PYTHON
  import gdb, os
  marker = os.environ["EVT_STACK_MARKER"]
  count = int(os.environ["EVT_STACK_COUNT"])
  class Stop(gdb.Breakpoint):
      seen = 0
      def stop(self):
          rows = []
          frame = gdb.newest_frame()
          while frame is not None:
              try:
                  sp = int(frame.read_register("rsp"))
              except gdb.error:
                  break
              symtab = frame.find_sal().symtab
              rows.append((frame.name() or "?", sp, bool(symtab and "/ext/evt/" in symtab.filename)))
              frame = frame.older()
          if not any(name == marker for name, _, _ in rows):
              return False
          Stop.seen += 1
          if Stop.seen < count:
              return False
          for name, sp, ours in rows:
              print("EVT_FRAME %s %d %d" % (name, sp, 1 if ours else 0))
          # The stack's top, as Ruby knows it: gdb's walk stops at the first frame of YJIT's code.
          print("EVT_STACK_START %d" % int(gdb.parse_and_eval("(unsigned long)ruby_current_ec->machine.stack_start")))
          return True  # stopped: gdb -batch then ends the program
  Stop("coroutine_transfer", internal=True)
PYTHON

def program(backend, wait, waiters)
  <<~RUBY
    require "evt"
    require "socket"
    pairs = Array.new(#{waiters}) { UNIXSocket.pair }
    Evt.run(backend: :#{backend}) do
      fibers = pairs.map { |a, _| Fiber.schedule { #{wait} } }
      Fiber.schedule do
        pairs.each { |_, b| b.write("x\\n") }
        fibers.each { |fiber| Fiber.scheduler.unblock(nil, fiber) if fiber.alive? } # the sleepers
      end
    end
  RUBY
end

waiters = Integer(ENV.fetch("WAITERS", "200"))
abort "wait_stack_depth: WAITERS must be positive" unless waiters.positive?

yjit = defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?
lib = File.expand_path("../../lib", __dir__)
puts "#{backend}, Ruby #{RUBY_VERSION}#{" with YJIT" if yjit}: the machine stack of the #{waiters}th fiber in a wait, at its switch away"
puts format("  %-14s %7s %6s %12s %6s %12s", "kind", "bytes", "pages", "Ruby above", "evt", "Ruby below")
Dir.mktmpdir do |dir|
  File.write(walker = File.join(dir, "walker.py"), WALKER)
  kinds.each do |kind|
    wait, marker = KINDS.fetch(kind)
    File.write(script = File.join(dir, "#{kind}.rb"), program(backend, wait, waiters))
    ruby = [RbConfig.ruby, *("--yjit" if yjit), "-I#{lib}", script]
    out = IO.popen({ "EVT_STACK_MARKER" => marker, "EVT_STACK_COUNT" => waiters.to_s }, ["gdb", "-q", "-batch", "-x", walker, "-ex", "run", "--args", *ruby],
                   err: %i[child out], &:read)
    frames = out.scan(/^EVT_FRAME (\S+) (\d+) ([01])$/).map { |name, sp, ours| [name, Integer(sp), ours == "1"] }
    if frames.empty?
      puts format("  %-14s failed: gdb saw no switch from that wait (%s)", kind, out.lines.last.to_s.strip)
      next
    end
    deepest = frames.first[1] - SWITCH_PUSH
    top = Integer(out[/^EVT_STACK_START (\d+)$/, 1] || frames.last[1])
    depth = top - deepest
    pages = (((top - 1) / PAGE) - (deepest / PAGE)) + 1
    # A frame's size is the distance from its stack pointer to its caller's.
    evt = frames.each_cons(2).sum { |(_, sp, ours), (_, outer, _)| ours ? outer - sp : 0 }
    last_evt = frames.rindex { |_, _, ours| ours }
    above = last_evt ? top - frames[last_evt + 1][1] : depth
    puts format("  %-14s %7d %6d %12d %6d %12d", kind, depth, pages, above, evt, depth - above - evt)
  end
end
