# frozen_string_literal: true

# How deep a waiting fiber's machine stack goes, by what it waits in, under evt: the bytes from the
# top of the fiber's stack to the deepest point of its switch away, and how many 4 KiB pages that
# touches (each one is RSS of every fiber waiting so, and what the GC scans of it). Split in three:
# Ruby's frames above evt (from the fiber's block to the hook), evt's own frames (those in evt.so),
# and Ruby's below them (rb_ensure, the switch itself). gdb stops the fiber at its switch
# (coroutine_transfer) and walks its frames; the program is a fiber in one wait, and another that
# ends it.
#
#   ruby [--yjit] bench/tools/wait_stack_depth.rb [BACKEND] [KIND ...]   (epoll; every kind)
#
# KIND: sleep, wait_readable, gets, read (IO#read(1)). Needs gdb, and Ruby's symbols (a Ruby built
# with -g, as bin/setup's are). bench/tools/fiber_memory_by_wait.rb measures the same through RSS.
require "rbconfig"
require "tmpdir"

KINDS = {
  # kind => [the wait, what ends it, a function on the waiting fiber's stack that says it is this wait]
  "sleep" => ["sleep", "Fiber.scheduler.unblock(nil, waiter)", "rb_f_sleep"],
  "wait_readable" => ["a.wait_readable", "b.write(\"x\\n\")", "io_wait_readable"],
  "gets" => ["a.gets", "b.write(\"x\\n\")", "rb_io_gets_m"],
  "read" => ["a.read(1)", "b.write(\"x\\n\")", "io_read"]
}.freeze
PAGE = 4096
SWITCH_PUSH = 48 # what coroutine_transfer pushes below the point gdb stops at (callee-saved registers)

backend = ARGV.first && !KINDS.key?(ARGV.first) ? ARGV.shift : "epoll"
kinds = ARGV.empty? ? KINDS.keys : ARGV
unknown = kinds - KINDS.keys
abort "wait_stack_depth: KIND is one of #{KINDS.keys.join(", ")}; not #{unknown.join(", ")}" unless unknown.empty?
abort "wait_stack_depth: needs gdb, which is not installed here" unless system("command -v gdb >/dev/null 2>&1")

# Run inside gdb: at every switch, the frames of the switching fiber; the first whose stack holds
# MARKER is printed as "name sp in_evt" lines, newest first, and the program stops there.
WALKER = <<~PYTHON
  import gdb, os
  marker = os.environ["EVT_STACK_MARKER"]
  class Stop(gdb.Breakpoint):
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
          for name, sp, ours in rows:
              print("EVT_FRAME %s %d %d" % (name, sp, 1 if ours else 0))
          return True  # stopped: gdb -batch then ends the program
  Stop("coroutine_transfer", internal=True)
PYTHON

def program(backend, wait, ending)
  <<~RUBY
    require "evt"
    require "socket"
    a, b = UNIXSocket.pair
    Evt.run(backend: :#{backend}) do
      waiter = Fiber.schedule { #{wait} }
      Fiber.schedule { #{ending} }
    end
  RUBY
end

yjit = defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?
lib = File.expand_path("../../lib", __dir__)
puts "#{backend}, Ruby #{RUBY_VERSION}#{" with YJIT" if yjit}: a waiting fiber's machine stack, at its switch away"
puts format("  %-14s %7s %6s %12s %6s %12s", "kind", "bytes", "pages", "Ruby above", "evt", "Ruby below")
Dir.mktmpdir do |dir|
  File.write(walker = File.join(dir, "walker.py"), WALKER)
  kinds.each do |kind|
    wait, ending, marker = KINDS.fetch(kind)
    File.write(script = File.join(dir, "#{kind}.rb"), program(backend, wait, ending))
    ruby = [RbConfig.ruby, *("--yjit" if yjit), "-I#{lib}", script]
    out = IO.popen({ "EVT_STACK_MARKER" => marker }, ["gdb", "-q", "-batch", "-x", walker, "-ex", "run", "--args", *ruby],
                   err: %i[child out], &:read)
    frames = out.scan(/^EVT_FRAME (\S+) (\d+) ([01])$/).map { |name, sp, ours| [name, Integer(sp), ours == "1"] }
    if frames.empty?
      puts format("  %-14s failed: gdb saw no switch from that wait (%s)", kind, out.lines.last.to_s.strip)
      next
    end
    deepest = frames.first[1] - SWITCH_PUSH
    top = frames.last[1]
    depth = top - deepest
    pages = (((top - 1) / PAGE) - (deepest / PAGE)) + 1
    # A frame's size is the distance from its stack pointer to its caller's.
    sizes = frames.each_cons(2).map { |(name, sp, ours), (_, outer, _)| [name, outer - sp, ours] }
    first_evt = sizes.index { |_, _, ours| ours }
    last_evt = sizes.rindex { |_, _, ours| ours }
    evt = first_evt ? sizes[first_evt..last_evt].sum { |_, size, ours| ours ? size : 0 } : 0
    above = last_evt ? sizes[(last_evt + 1)..].sum { |_, size, _| size } : depth
    puts format("  %-14s %7d %6d %12d %6d %12d", kind, depth, pages, above, evt, depth - above - evt)
  end
end
