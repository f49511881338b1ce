# frozen_string_literal: true

require "test_helper"
require "rbconfig"

# Every wait of the loop in the kernel can be ended from outside, on every backend and Ruby:
# Thread#raise (what Timeout.timeout and the tests' watchdog use), Timeout.timeout itself, and a
# signal whose handler raises. A wait that could not be reached holds its thread for ever, and may
# hold the GVL with it, so that no thread of the process could help: each scenario runs in a child
# Ruby, killed from here if it is still running after a generous limit.
class InterruptibleTest < Minitest::Test
  LIMIT = 60 # seconds the whole child may take; each scenario ends in a fraction of a second

  SCRIPT = <<~'RUBY'
    require "evt"
    require "timeout"
    $stdout.sync = true

    class Stop < StandardError; end

    # Runs +waiting+ in a fiber of a loop on a thread of its own, then interrupts that thread with
    # +how+ once the loop waits in the kernel (the thread sleeps); prints what ended the thread.
    def scenario(name, how, &waiting)
      reader, writer = IO.pipe
      thread = Thread.new do
        Thread.current.report_on_exception = false
        if how == :timeout
          Timeout.timeout(0.2) { Evt.run { Fiber.schedule { waiting.call(reader) } } }
        else
          Evt.run { Fiber.schedule { waiting.call(reader) } }
        end
      end
      Thread.pass until thread.status == "sleep" || !thread.alive?
      sleep 0.05
      thread.raise(Stop, name) if how == :raise
      outcome = begin
        thread.join(10) ? :returned : :still_waiting
      rescue Exception => e # rubocop:disable Lint/RescueException
        e.class.name
      end
      puts "#{name} #{how}: #{outcome}"
    ensure
      [reader, writer].each { |io| io&.close }
    end

    waits = {
      "read" => ->(r) { r.read(1) },
      "wait_readable" => ->(r) { r.wait_readable },
      "select" => ->(r) { IO.select([r]) },
      "select_nothing" => ->(_) { IO.select(nil, nil, nil) },
      "sleep" => ->(_) { sleep },
      "queue" => ->(_) { Thread::Queue.new.pop },
    }
    waits.each do |name, waiting|
      %i[raise timeout].each { |how| scenario(name, how, &waiting) }
    end

    # A signal whose handler raises, to the main thread while its own loop waits in the kernel.
    Signal.trap("USR2") { raise Stop, "signal" }
    killer = Thread.new do
      sleep 0.05 until Thread.main.status == "sleep"
      sleep 0.05
      Process.kill("USR2", Process.pid)
    end
    outcome = begin
      r, w = IO.pipe
      Evt.run { Fiber.schedule { r.read(1) } }
      :returned
    rescue Stop
      "Stop"
    ensure
      killer.join
      [r, w].each { |io| io&.close }
    end
    puts "main signal: #{outcome}"

    # The selector (async's face), blocked in select with nothing to do, and Thread#raise.
    if Evt.extension?
      thread = Thread.new do
        Thread.current.report_on_exception = false
        selector = Evt::Selector.new(Fiber.current)
        selector.select(nil)
      end
      Thread.pass until thread.status == "sleep" || !thread.alive?
      sleep 0.05
      thread.raise(Stop, "selector")
      outcome = begin
        thread.join(10) ? :returned : :still_waiting
      rescue Stop
        "Stop"
      end
      puts "selector raise: #{outcome}"
    end
  RUBY

  def test_every_kernel_wait_ends_on_thread_raise_timeout_and_signals
    output, status = run_ruby(SCRIPT, limit: LIMIT)
    refute_nil status, "the child was still running after #{LIMIT} s: a wait held its thread:\n#{output}"
    assert status.success?, "the child failed (#{status.inspect}):\n#{output}"
    lines = output.lines.map(&:chomp).grep(/: /).to_h { |line| line.split(": ", 2) }
    %w[read wait_readable select select_nothing sleep queue].each do |wait|
      assert_equal "Stop", lines["#{wait} raise"], "#{wait}: Thread#raise\n#{output}"
      assert_equal "Timeout::Error", lines["#{wait} timeout"], "#{wait}: Timeout.timeout\n#{output}"
    end
    assert_equal "Stop", lines["main signal"], output
    assert_equal "Stop", lines["selector raise"], output if Evt.extension? && !SELECT
  end
end
