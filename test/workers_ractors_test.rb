# frozen_string_literal: true

require "test_helper"

# Evt::Workers with `ractors:`: the workers are Ractors of the supervisor's process, each with its
# own loop and its own descriptor of the listener. Ruby 3.3 and 3.4 allow one such worker (see
# RactorTest), so these tests run one; the supervision is the same for any number.
class WorkersRactorsTest < Minitest::Test
  include WorkersHelpers
  include QuietRactors

  # The workers' block: made where self is nil, so it can be shared with the Ractors. A line
  # protocol: "who" answers the Ractor and the process; "slow" answers "started", then "done" 0.3 s
  # later; "crash" makes the worker end with an exception once the answer is out.
  APP = nil.instance_exec do
    proc do |worker|
      crashed = false
      listener = worker.listeners.first
      until worker.stopping?
        # Each connection's own variable: an `until` body has none of its own, and a fiber that read
        # a shared `client` after it waited would serve (and close) the next connection instead.
        listener.accept.then do |client|
          Fiber.schedule do
            while (line = client.gets)
              case line.chomp
              when "who" then client.puts("#{Ractor.current.object_id} #{Ractor.current == Ractor.main} #{Process.pid}")
              when "slow"
                client.puts("started")
                sleep 0.3
                client.puts("done")
              when "crash"
                crashed = true
                client.puts("crashing")
                listener.close
              end
            end
          ensure
            client.close
          end
        end
      end
    rescue IOError
      raise "the worker was asked to crash" if crashed
    end
  end

  STOP_TIMEOUT = 5

  # WorkersHelpers#stop, and a worker that stops when told: an idle one (or one finishing a 0.3 s
  # request) ends at once, so a supervisor that waited out stop_timeout for it means the word to stop
  # was lost (as it was, 1 run in 10, while a thread beside the loop waited for it in Ractor.receive).
  def stop(supervisor)
    status = nil
    assert_stopped_when_told(elapsed { status = super })
    status
  end

  def assert_stopped_when_told(took)
    assert_operator took, :<, STOP_TIMEOUT, "the worker Ractor did not stop when told: the supervisor waited out stop_timeout"
  end

  def start_supervisor(ractors: 1)
    server = TCPServer.new("127.0.0.1", 0)
    port = server.local_address.ip_port
    supervisor = fork do
      $stderr.reopen(File::NULL) # the crash test's report
      Evt::Workers.new(ractors: ractors, listeners: [server], stop_timeout: STOP_TIMEOUT, backend: EvtTest::BACKEND).run(APP)
      exit!(0)
    rescue Exception # rubocop:disable Lint/RescueException
      exit!(1)
    end
    server.close
    [supervisor, port]
  end

  def test_the_worker_is_a_ractor_of_the_supervisors_process
    supervisor, port = start_supervisor
    ractor, main, pid = ask(port, "who").split
    assert_equal supervisor, Integer(pid)
    assert_equal "false", main
    assert_equal [ractor], Array.new(5) { ask(port, "who").split.first }.uniq
  ensure
    assert stop(supervisor).success? if supervisor
  end

  # Where the Ruby runs fibers in several Ractors at once (see RactorTest).
  def test_two_ractor_workers_share_the_listener
    skip "Ruby #{RUBY_VERSION} allows one Ractor worker (ruby/ruby#13466)" unless Evt::Workers::PARALLEL_RACTOR_FIBERS

    supervisor, port = start_supervisor(ractors: 2)
    seen = []
    Timeout.timeout(15) { seen |= [ask(port, "who").split.first] until seen.size == 2 }
    assert_equal 2, seen.size
  ensure
    assert stop(supervisor).success? if supervisor
  end

  def test_a_ractor_worker_that_ends_with_an_exception_is_started_again
    supervisor, port = start_supervisor
    first = ask(port, "who").split.first
    assert_equal "crashing", ask(port, "crash")
    second = nil
    Timeout.timeout(10) { second = ask(port, "who")&.split&.first until second && second != first }
    refute_equal first, second
  ensure
    assert stop(supervisor).success? if supervisor
  end

  def test_sigterm_lets_a_ractor_workers_requests_in_flight_finish
    supervisor, port = start_supervisor
    ask(port, "who")
    socket = TCPSocket.new("127.0.0.1", port)
    socket.puts("slow")
    assert_equal "started", Timeout.timeout(10) { socket.gets&.chomp } # in flight now
    Process.kill("TERM", supervisor)
    assert_equal "done", Timeout.timeout(10) { socket.gets&.chomp }
    socket.close
    status = nil
    took = elapsed { _, status = Timeout.timeout(20) { Process.wait2(supervisor) } }
    assert status.success?
    assert_stopped_when_told(took)
    supervisor = nil
  ensure
    stop(supervisor) if supervisor
  end

  def test_sighup_replaces_the_ractor_worker_losing_no_connection
    supervisor, port = start_supervisor
    before = ask(port, "who").split.first
    Process.kill("HUP", supervisor)
    answers = []
    Timeout.timeout(15) { answers << ask(port, "who")&.split&.first until answers.compact.last(5).size == 5 && !answers.last(5).include?(before) }
    refute_includes answers, nil, "a connection was lost during the restart"
  ensure
    assert stop(supervisor).success? if supervisor
  end

  def test_what_ractors_refuses
    error = assert_raises(ArgumentError) { Evt::Workers.new(count: 2, ractors: 1) }
    assert_match(/not both/, error.message)
    assert_raises(ArgumentError) { Evt::Workers.new(ractors: 0) }
    if Evt::Workers::PARALLEL_RACTOR_FIBERS
      assert_equal 2, Evt::Workers.new(ractors: 2).count
    else
      error = assert_raises(ArgumentError) { Evt::Workers.new(ractors: 2) }
      assert_match(/ruby\/ruby#13466.*count: 2/, error.message)
    end
    outer = 1
    error = assert_raises(ArgumentError) do
      Timeout.timeout(10) { Evt::Workers.new(ractors: 1).run { |worker| worker && outer } }
    end
    assert_match(/must be shareable/, error.message)
  end
end
