# frozen_string_literal: true

# The smoke suite of an installed evt: what every program does with a scheduler, once each, on the
# backend EVT_BACKEND names (else the default), with nothing but Ruby and evt (no minitest, no
# bundler: it runs in test/gem/minimal_root's root). Prints a line per check and ends with
# "smoke: N passed, N failed"; exits non-zero when a check failed.
#
#   ruby test/gem/smoke.rb
require "evt"
require "socket"
require "timeout"
require "rbconfig"
require "tempfile"

module Smoke
  @passed = 0
  @failed = 0

  def self.check(name)
    result = Evt.run { yield }
    if result == true
      @passed += 1
      puts "ok    #{name}"
    else
      @failed += 1
      puts "FAIL  #{name}: #{result.inspect}"
    end
  rescue Exception => e # rubocop:disable Lint/RescueException: a check's failure of any kind is reported
    @failed += 1
    puts "FAIL  #{name}: #{e.class}: #{e.message}\n      #{e.backtrace&.first(3)&.join("\n      ")}"
  end

  def self.finish
    puts "smoke: #{@passed} passed, #{@failed} failed"
    exit(@failed.zero? ? 0 : 1)
  end
end

wanted = ENV.fetch("EVT_BACKEND", "")
Smoke.check("the C extension, on #{wanted.empty? ? "the default backend" : wanted}") do
  Evt.extension? && (wanted.empty? || Fiber.scheduler.backend.to_s == wanted) || [Evt::EXTENSION_MISSING, Fiber.scheduler.backend]
end

Smoke.check("a pipe between two fibers, 1,000 round trips") do
  a_in, a_out = IO.pipe
  b_in, b_out = IO.pipe
  Fiber.schedule { 1000.times { b_out.write(a_in.read(1)) } }
  got = Array.new(1000) { |i| a_out.write((i % 10).to_s); b_in.read(1) }.join
  got == Array.new(1000) { |i| (i % 10).to_s }.join || got.size
end

Smoke.check("a TCP echo server and 20 clients at once") do
  server = TCPServer.new("127.0.0.1", 0)
  Fiber.schedule do
    loop do
      client = server.accept
      Fiber.schedule do
        loop { client.write(client.readpartial(100)) }
      rescue EOFError
        client.close
      end
    end
  rescue IOError
    nil
  end
  answers = Array.new(20)
  clients = Array.new(20) do |i|
    Fiber.schedule do
      socket = TCPSocket.new("127.0.0.1", server.local_address.ip_port)
      socket.write("hello #{i}")
      answers[i] = socket.readpartial(100)
      socket.close
    end
  end
  sleep 0.001 while clients.any?(&:alive?)
  server.close
  answers == Array.new(20) { |i| "hello #{i}" } || answers
end

Smoke.check("a UNIX socket pair carries 1 MiB both ways") do
  left, right = UNIXSocket.pair
  payload = Random.new(1).bytes(1 << 20)
  writer = Fiber.schedule { left.write(payload); left.close_write }
  echoed = right.read
  !writer.alive? && echoed == payload || echoed&.bytesize
end

Smoke.check("50 fibers sleep 50 ms at once, in well under 50 x 50 ms") do
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  fibers = Array.new(50) { Fiber.schedule { sleep 0.05 } }
  sleep 0.001 while fibers.any?(&:alive?)
  elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  elapsed.between?(0.05, 1.0) || elapsed
end

Smoke.check("Queue, Mutex and ConditionVariable between fibers") do
  queue = Thread::Queue.new
  mutex = Thread::Mutex.new
  ready = Thread::ConditionVariable.new
  order = []
  Fiber.schedule { 3.times { |i| queue << i } }
  Fiber.schedule { mutex.synchronize { ready.wait(mutex) until order.size == 3; order << :woken } }
  3.times { order << queue.pop }
  mutex.synchronize { ready.signal }
  sleep 0.001 until order.size == 4
  order == [0, 1, 2, :woken] || order
end

Smoke.check("Timeout.timeout ends a read nobody answers") do
  reader, _writer = IO.pipe
  Timeout.timeout(0.05) { reader.read(1) }
  false
rescue Timeout::Error
  true
end

Smoke.check("IO.select sees a pipe written by another fiber") do
  reader, writer = IO.pipe
  Fiber.schedule { sleep 0.01; writer.write("x") }
  ready = IO.select([reader], nil, nil, 5)
  ready == [[reader], [], []] || ready
end

Smoke.check("Process.wait on a child") do
  pid = Process.spawn(RbConfig.ruby, "-e", "exit 3")
  _, status = Process.wait2(pid)
  status.exitstatus == 3 || status
end

Smoke.check("Thread#join and a DNS look-up of localhost from a fiber") do
  thread = Thread.new { sleep 0.01; :joined }
  addresses = Addrinfo.getaddrinfo("localhost", 80, nil, :STREAM).map(&:ip_address)
  [thread.value, addresses.any?] == [:joined, true] || [thread.value, addresses]
end

Smoke.check("IO#close wakes a fiber waiting on the IO") do
  reader, _writer = IO.pipe
  outcome = nil
  waiter = Fiber.schedule do
    reader.read(1)
  rescue IOError => e
    outcome = e.class
  end
  reader.close
  sleep 0.001 while waiter.alive?
  outcome == IOError || outcome
end

Smoke.check("a file read and written through the scheduler") do
  Tempfile.create("evt-smoke") do |file|
    file.write("smoke " * 1000)
    file.flush
    File.read(file.path) == "smoke " * 1000
  end
end

Smoke.finish
