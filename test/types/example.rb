# frozen_string_literal: true

# A small program that uses evt's public API the way the README shows it. test/types_test.rb runs it
# under rbs's runtime type checker against the real classes:
#
#   RBS_TEST_TARGET='Evt::*' RBS_TEST_OPT='-I sig' RBS_TEST_LOGLEVEL=error RBS_TEST_RAISE=true \
#     ruby -Ilib -rbundler/setup -rrbs/test/setup test/types/example.rb
#
# Every call into Evt's classes then has its arguments, its block's and its return value checked
# against sig/: the calls this program makes (Evt.run, Evt::Scheduler.new, Evt::Workers#run...) and
# the hooks Ruby makes on the scheduler for it (io_wait, io_read, kernel_sleep, block, unblock,
# timeout_after, io_select, process_wait, address_resolve, blocking_operation_wait, io_close,
# fiber_interrupt...). A mismatch raises RBS::Test::Tester::TypeError (an Exception) where the call
# returns; the test fails on it, on anything printed to stderr, and on output other than the lines
# below (one per part, each part checking its own results: `check` aborts on a wrong one).
#
# It runs on whatever EVT_BACKEND and EVT_NO_EXTENSION say, as the rest of the suite does.
require "evt"
require "socket"
require "timeout"
require "zlib"
require "tempfile"

Warning[:experimental] = false # IO::Buffer's warning (the test wants nothing on stderr)

# rbs's checker installs its hooks into a class when a class body of it ends (TracePoint :end). With
# the C extension, Evt::Loop is defined in C and no Ruby code opens it: opening it here hooks its
# methods too (the hooks Ruby calls on an Evt::Scheduler, which inherits them).
module Evt
  class Loop
  end
end

def check(what, condition)
  abort "example: #{what}" unless condition
end

def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# The pure-Ruby loop, and EVT_BACKEND=select where the C loop has no select backend of its own:
# no Evt::Selector there (test/test_helper.rb's SELECT).
requested = ENV.fetch("EVT_BACKEND", "")
backend = requested.empty? ? Evt::Scheduler.availables.first : requested.to_sym
select_loop = !Evt.extension? || (backend == :select && !Evt::Loop.backends.include?(:select))

# ---- what evt tells about itself -----------------------------------------------------------------
check "VERSION", Evt::VERSION.match?(/\A\d+\.\d+\.\d+/)
check "extension?", Evt.extension? == Evt::EXTENSION_MISSING.nil?
natives = Evt::Scheduler.availables.reject { |name| Evt::Loop.emulation(name) }
check "availables", natives.last == :select && Evt::Scheduler.availables.include?(backend)
check "emulation", Evt::Loop.emulation(:select).nil?
check "backends", (Evt::Loop.backends & Evt::Scheduler.availables) == Evt::Loop.backends.select { |name| Evt::Loop.probe(name).nil? }
check "probe", Evt::Loop.probe(:no_such_backend) == "unknown backend"
buggy = Evt::RUBY_BUGS.keys.first
check "ruby_warning", (buggy.nil? || Evt.ruby_warning(buggy).include?(buggy)) && Evt.ruby_warning("0.0.0").nil?
check "HOOKS", Evt::HOOKS.fetch(:io_wait).to_s.include?("io_wait")
puts "api: ok"

# ---- Evt.run: fibers sleep at once, and talk over a socket pair and a pipe -------------------------
value = Evt.run do
  started = clock
  sleepers = Array.new(3) { Fiber.schedule { sleep 0.2 } } # while the rest of the block runs

  left, right = UNIXSocket.pair
  Fiber.schedule do
    left.write("ping")
    reply = left.read(4) # waits in the loop (io_read, io_wait) until the other fiber answers
    check "socket reply", reply == "pong"
    left.close
  end
  check "socket read", right.read(4) == "ping"
  right.write("pong")
  check "socket end of file", right.read == "" # the other side closed
  right.close

  reader, writer = IO.pipe
  Fiber.schedule do
    sleep 0.01
    writer.puts("through the pipe")
    writer.close
  end
  check "IO.select", IO.select([reader], nil, nil, 5) == [[reader], [], []]
  check "wait_readable", reader.wait_readable(5).equal?(reader) # io_wait
  check "pipe", reader.gets == "through the pipe\n"
  reader.close

  # A queue fed by another thread (block here, unblock from there), a timeout, a mutex.
  queue = Thread::Queue.new
  Thread.new { sleep 0.01; queue << :from_a_thread }
  check "queue", queue.pop == :from_a_thread
  timed_out = begin
    Timeout.timeout(0.01) { sleep 1 }
  rescue Timeout::Error
    true
  end
  check "timeout", timed_out
  mutex = Thread::Mutex.new
  order = []
  Fiber.schedule { mutex.synchronize { sleep 0.01; order << :first } }
  mutex.synchronize { order << :second }
  check "mutex", order == %i[first second]

  # IO#close of a pipe another fiber reads: it raises IOError (Ruby 4.0: fiber_interrupt, io_close).
  reader, writer = IO.pipe
  error = nil
  Fiber.schedule do
    reader.read
  rescue IOError => e
    error = e
  end
  reader.close
  writer.close
  sleep 0.01 until error || clock - started > 5
  check "close wakes the reader", error.is_a?(IOError)

  sleepers.each { |fiber| sleep 0.01 while fiber.alive? }
  check "sleepers slept at once", clock - started < 0.55 # one after the other: 0.6 s
  :the_block_value
end
check "Evt.run's value", value == :the_block_value
puts "run: slept at once, ping pong, pipe, queue, timeout, mutex, close"

# ---- Evt::Scheduler.new(backend:) with Fiber.set_scheduler ------------------------------------------
scheduler = Evt::Scheduler.new(backend: backend, pool_size: 1)
check "backend", scheduler.backend == backend
check "pool_size", scheduler.pool_size == 1
check "a new loop", !scheduler.closed? && scheduler.waiting.zero?
Fiber.set_scheduler(scheduler)
results = {}
Fiber.schedule do
  pid = Process.spawn("/bin/sh", "-c", "exit 3")
  _, status = Process.wait2(pid) # process_wait
  results[:process] = status.exitstatus
end
Fiber.schedule { results[:addresses] = Addrinfo.getaddrinfo("localhost", nil, nil, :STREAM).map(&:ip_address) }
Fiber.schedule { results[:zlib] = Zlib.inflate(Zlib.deflate("x" * 200_000)).size } # blocking_operation_wait (3.4+)
Fiber.schedule do
  scheduler.yield # as sleep(0): the others run first
  results[:yield] = true
end
Fiber.set_scheduler(nil) # runs the loop until every fiber is done, then closes the scheduler
check "process", results[:process] == 3
check "address_resolve", results[:addresses].include?("127.0.0.1") || results[:addresses].include?("::1")
check "zlib", results[:zlib] == 200_000
check "yield", results[:yield]
check "closed", scheduler.closed?
puts "scheduler: process, address_resolve, zlib, yield"

# ---- what a scheduler shows of itself: stats, fibers, the dump, stall reports, fallbacks ----------
reports = []
insight = Evt::Scheduler.new(backend: backend, stall: 0.05, on_stall: ->(report) { reports << report })
check "backend_fallbacks", insight.backend_fallbacks.is_a?(Hash)
Fiber.set_scheduler(insight)
waiting, pipe_writer = IO.pipe
Fiber.schedule { waiting.read(1) }
Fiber.schedule do
  states = insight.fibers
  check "fibers", states.map(&:wait).compact == [:io] && states.all? { |state| state.to_s.start_with?("fiber ") }
  dump = Tempfile.create("dump")
  Evt.dump(dump)
  check "dump", dump.size.positive?
  dump.close
  finish = clock + 5
  nil until reports.any? { |report| report.state == :ongoing } || clock > finish # a report while it goes on
  check "stats", insight.stats[:fibers_alive] == 2
  pipe_writer.write("x")
end
Fiber.set_scheduler(nil)
check "stall reports", reports.map(&:state).uniq.sort == %i[ended ongoing] && reports.all? { |report| report.to_json.start_with?("{") }
puts "insight: stats, fibers, dump, stall reports"

# ---- Evt::SelectScheduler, the pure-Ruby loop, on request --------------------------------------------
select_scheduler = Evt::SelectScheduler.new(pool_size: 0)
check "select backend", select_scheduler.backend == :select
Fiber.set_scheduler(select_scheduler)
reader, writer = IO.pipe
read = nil
Fiber.schedule { read = reader.read(5) }
Fiber.schedule do
  sleep 0.01
  writer.write("hello")
end
select_scheduler.close # as the thread's scheduler: Fiber.set_scheduler(nil), which runs the loop
check "select scheduler read", read == "hello" && Fiber.scheduler.nil?
reader.close
writer.close
puts "select scheduler: hello"

# ---- Evt::Workers: one worker process serving a listener, stopped as SIGTERM would -------------------
server = TCPServer.new("127.0.0.1", 0)
port = server.local_address.ip_port
workers = Evt::Workers.new(count: 1, listeners: [server], stop_timeout: 5)
answers = []
pids = nil
client = Thread.new do # two clients, then the stop a SIGTERM would give
  2.times do
    TCPSocket.open("127.0.0.1", port) do |socket|
      socket.timeout = 5 # a worker that failed answers nothing: no hang
      answers << socket.gets
    end
  end
rescue IO::TimeoutError
  answers << :timed_out
ensure
  pids = workers.pids
  workers.stop
end
returned = workers.run do |worker|
  worker.on_stop { nil }
  until worker.stopping?
    connection = server.accept
    Fiber.schedule do
      connection.puts("served by worker #{worker.index}")
      connection.close
    end
  end
rescue IOError
  nil # told to stop: the listener closed
end
client.join
server.close
check "Workers#run returns the workers", returned.equal?(workers)
check "no restart", workers.restarts.zero? && workers.count == 1 && pids&.size == 1
check "answers", answers == ["served by worker 0\n"] * 2
puts "workers: served by worker 0, twice"

# ---- Evt::Selector (async's interface), where the C loop runs ----------------------------------------
if select_loop
  puts "selector: none on the pure-Ruby loop"
else
  selector = Evt::Selector.new(Fiber.current, backend: backend)
  check "selector backend", selector.backend == backend && selector.loop.equal?(Fiber.current)
  left, right = UNIXSocket.pair
  got = nil
  Fiber.new do
    buffer = IO::Buffer.new(5)
    check "selector io_wait", selector.io_wait(Fiber.current, left, IO::READABLE) == IO::READABLE
    check "selector io_read", selector.io_read(Fiber.current, left, buffer, 5).equal?(5)
    got = buffer.get_string
  end.transfer
  Fiber.new { selector.io_write(Fiber.current, right, IO::Buffer.for("hello"), 5) }.transfer
  deadline = clock + 5
  selector.select(0.05) until got || clock > deadline
  check "selector read", got == "hello"
  check "selector ready?", !selector.ready?
  selector.close
  check "selector closed?", selector.closed?
  left.close
  right.close
  puts "selector: hello"
end
