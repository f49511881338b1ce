# frozen_string_literal: true

require "minitest/autorun"
require "evt"
require "socket"
require "timeout"
require "tmpdir"
require "fileutils"

# Helpers for the behaviour tests. Every test runs on the backend bin/test chose (EVT_BACKEND).
module EvtTest
  # The executable of +gem+ at the version Gemfile.lock names (the :docs group's yard and rbs): the
  # checks that use one fail, rather than skip, without it.
  def self.locked_gem_executable(gem)
    locked = File.read(File.expand_path("../Gemfile.lock", __dir__))[/^    #{Regexp.escape(gem)} \(([^)]+)\)$/, 1]
    raise Minitest::Assertion, "Gemfile.lock names no #{gem}: run bin/setup (the Gemfile's :docs group has it)" unless locked

    Gem.bin_path(gem, gem, locked)
  rescue Gem::LoadError, Gem::Exception => e
    raise Minitest::Assertion, "#{gem} #{locked} is not installed for Ruby #{RUBY_VERSION} (#{e.class}): run bin/setup"
  end

  # The backend under test; nil when EVT_BACKEND is unset (the default choice).
  BACKEND = ENV.fetch("EVT_BACKEND", "").then { |name| name.empty? ? nil : name.to_sym }
  # Whether the tests run on the pure-Ruby loop (what it cannot offer is in the README): without the
  # extension, or for select where the extension has no select backend of its own.
  SELECT = !Evt.extension? || (BACKEND == :select && !Evt::Loop.backends.include?(:select))

  # Evt.run with a guard: a hang fails this test instead of stalling the whole run, with what each
  # fiber waited for and where in the failure's first line (the end of a long run shows that line
  # only), and Evt.dump's whole text on stderr.
  def evt(timeout: 30, &block)
    runner = Thread.current
    done = Queue.new
    watchdog = Thread.new do
      next if done.pop(timeout: timeout)

      runner.raise(Timeout::Error, "Evt.run still running after #{timeout} s: #{hang_report}")
    end
    Evt.run(&block)
  ensure
    done << true
    watchdog&.join
  end

  # What the fibers of this Ractor's schedulers wait for, short enough for the failure's first line:
  # each kind of wait (Evt::FiberState's, less the fiber and the times) with the innermost frame of
  # its fibers' backtraces outside evt (evt's C hooks show in their caller's file, under their own
  # name), counted. Evt.dump, whole, goes to stderr.
  def hang_report
    Evt.dump
    states = Evt::Insight.schedulers.keys.reject(&:closed?).flat_map(&:fibers)
    kinds = states.map do |state|
      wait = [state.wait || state.state, state.fd && "fd=#{state.fd}", *state.events].compact.join(" ")
      frame = state.backtrace&.find { |line| !line.match?(%r{/lib/evt|<internal:|Evt::}) }
      "[#{wait}] at #{frame&.split("/")&.last(2)&.join("/")}"
    end
    "#{states.size} fibers: " + kinds.tally.map { |kind, count| "#{count} x #{kind}" }.join("; ")
  rescue StandardError => e
    "(no report: #{e.class}: #{e.message})"
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def elapsed
    started = monotonic
    yield
    monotonic - started
  end

  def open_descriptors
    close_kept_kqueues
    Dir.children("/proc/self/fd").size
  end

  # The kqueue backend on Linux keeps the kqueues of closed loops for the next ones (libkqueue
  # cannot close them safely while other threads open kqueues); a count of descriptors closes
  # them first, as no other thread opens a loop then. libkqueue releases the two descriptors it
  # holds for each (its epoll and a pipe's end) from a thread of its own: waited for, 2 s at most.
  def close_kept_kqueues
    return unless Evt::Loop.respond_to?(:close_kept, true)

    open = Dir.children("/proc/self/fd").size
    closed = Evt::Loop.__send__(:close_kept)
    return if closed.zero?

    released = open - 3 * closed # each kqueue's own number and the two libkqueue holds
    deadline = monotonic + 2
    sleep 0.005 until Dir.children("/proc/self/fd").size <= released || monotonic > deadline
  end

  # Runs +script+ in a new Ruby with evt's lib: what it printed (stdout and stderr), and how it
  # ended (nil: still running after +limit+ seconds, then killed).
  def run_ruby(script, limit:)
    IO.popen([RbConfig.ruby, "-W:no-experimental", "-I", File.expand_path("../lib", __dir__), "-e", script],
             err: %i[child out]) do |child|
      reader = Thread.new { child.read }
      if reader.join(limit)
        Process.wait(child.pid)
        [reader.value, $?]
      else
        Process.kill(:KILL, child.pid)
        [reader.value, nil]
      end
    end
  end

  # The descriptors open now, once IOs dropped earlier are collected: number => what it refers to
  # (the directory the listing itself opened is gone by the time it is read, so it is left out).
  def descriptor_table
    GC.start
    close_kept_kqueues
    Dir.children("/proc/self/fd").filter_map do |fd|
      [fd, File.readlink("/proc/self/fd/#{fd}")]
    rescue Errno::ENOENT
      nil
    end.to_h
  end

  # Fails if a descriptor opened since +before+ (a descriptor_table) is still open. Descriptors
  # closed meanwhile do not count: an IO an earlier test dropped is closed whenever the GC gets to
  # it, which a conservative stack scan may put off past any one GC.start.
  # libkqueue (the kqueue backend on Linux) releases a closed kqueue's own descriptors from a
  # thread of its own, a moment later: the table is read again until they are gone, for 2 s at most.
  def assert_no_descriptor_leaked(before, message = "a descriptor leaked")
    deadline = monotonic + 2
    leaked = nil
    loop do
      leaked = descriptor_table.reject { |fd, target| before[fd] == target }
      break if leaked.empty? || monotonic > deadline

      sleep 0.01
    end
    assert_empty leaked, message
  end

  def median(values)
    values.sort[values.size / 2]
  end

  # The error Ruby raises for the same call without a scheduler.
  def error_without_scheduler
    yield
    flunk "expected the call to raise without a scheduler"
  rescue Minitest::Assertion
    raise
  rescue Exception => e # rubocop:disable Lint/RescueException
    e
  end
end

Minitest::Test.include(EvtTest)

# A child a test forked and left running is killed when the test ends, saying so: a child stuck
# for good (libasan's allocator can leave one waiting for a lock another thread held at the fork)
# would otherwise keep bin/test's output pipe open, and the whole run with it.
module ForkedChildren
  @pids = []

  class << self
    attr_reader :pids
  end

  # Process.fork's hook, in the process that forks.
  module Hook
    def _fork
      pid = super
      ForkedChildren.pids << pid if pid.positive?
      pid
    end
  end
  Process.singleton_class.prepend(Hook)

  def after_teardown
    super
    ForkedChildren.pids.each do |pid|
      next if Process.waitpid(pid, Process::WNOHANG)

      warn "== #{self.class}##{name} left its forked child #{pid} running: killed"
      Process.kill(:KILL, pid)
      Process.waitpid(pid)
    rescue Errno::ECHILD, Errno::ESRCH
      nil # reaped already, or not this process's child
    end
    ForkedChildren.pids.clear
  end
end

Minitest::Test.include(ForkedChildren)

# Evt::Workers' tests: one line to the server on +port+ and its one-line answer; a supervisor told
# to stop, and how it ended.
module WorkersHelpers
  def ask(port, line)
    Timeout.timeout(10) do
      TCPSocket.open("127.0.0.1", port) do |socket|
        socket.puts(line)
        socket.gets&.chomp
      end
    end
  end

  def stop(supervisor)
    Process.kill("TERM", supervisor)
    _, status = Timeout.timeout(20) { Process.wait2(supervisor) }
    status
  end
end

# Database client tests: ten fibers, each a query of 0.3 s through a pool of ten connections made
# by +connect+; the block runs query +i+ on a connection and returns its number. They end together
# (well under the 3 s one after another would take), each with its own answer.
module PoolOverlap
  def assert_pooled_queries_overlap(connect)
    results = []
    took = elapsed do
      evt do
        pool = ConnectionPool.new(size: 10, timeout: 10) { connect.call }
        10.times { |i| Fiber.schedule { pool.with { |conn| results << yield(conn, i) } } }
      end
    end
    assert_equal (0...10).to_a, results.sort
    assert_operator took, :<, 2.5, "ten 0.3 s queries took #{took} s: they did not overlap"
  end
end

# Ractor tests: Ruby's "Ractor is experimental" warning, off for the test only.
module QuietRactors
  def setup
    super
    @experimental = Warning[:experimental]
    Warning[:experimental] = false
  end

  def teardown
    Warning[:experimental] = @experimental
    super
  end
end

# A hung test must not take the whole run down with it unnamed. Each test's name goes to the file
# EVT_TEST_CURRENT (bin/test prints it if the run is killed), and a test still running after
# EVT_TEST_HANG seconds (default 180) has every thread's backtrace printed and is interrupted with
# HangWatch::Hung, an error that fails it, so the run goes on.
module HangWatch
  LIMIT = Float(ENV.fetch("EVT_TEST_HANG", "180"))
  CURRENT = ENV["EVT_TEST_CURRENT"].then { |path| path.nil? || path.empty? ? nil : path }

  class Hung < Exception; end # rubocop:disable Lint/InheritException -- no `rescue => e` may swallow it

  @lock = Mutex.new
  @watched = nil # [test name, its thread, deadline]

  def self.watch(name, thread)
    @lock.synchronize do
      @watched = [name, thread, Process.clock_gettime(Process::CLOCK_MONOTONIC) + LIMIT]
      # (again after a fork, which leaves no thread but the forking one)
      @watcher = Thread.new { patrol }.tap { |watcher| watcher.name = "evt test watchdog" } unless @watcher&.alive?
    end
    yield
  ensure
    @lock.synchronize { @watched = nil }
  end

  def self.patrol
    loop do
      sleep 1
      name, thread = @lock.synchronize do
        next unless @watched && Process.clock_gettime(Process::CLOCK_MONOTONIC) > @watched[2]

        @watched.tap { @watched = nil }
      end
      next unless thread

      warn "== #{name} still running after #{LIMIT} s: interrupted. Threads:"
      Thread.list.each { |each| warn "-- #{each.inspect}\n  #{(each.backtrace || []).join("\n  ")}" }
      thread.raise(Hung, "#{name} hung: still running after #{LIMIT} s")
    end
  end

  def run
    name = "#{self.class}##{self.name}"
    File.write(CURRENT, "#{name}\n") if CURRENT
    HangWatch.watch(name, Thread.current) { super }
  end
end

Minitest::Test.prepend(HangWatch)
