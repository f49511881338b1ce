# frozen_string_literal: true

require "test_helper"


# Evt::Workers: one event loop per worker process on a shared listening socket, supervised.
class WorkersTest < Minitest::Test
  include WorkersHelpers

  # A line-protocol server: "pid" answers the worker's pid, "slow" answers after 0.3 s, "crash"
  # ends the worker at once.
  def start_supervisor(count: 2)
    server = TCPServer.new("127.0.0.1", 0)
    port = server.local_address.ip_port
    supervisor = fork do
      Evt::Workers.new(count: count, listeners: [server], stop_timeout: 5).run { |worker| serve(worker, server) }
      exit!(0)
    rescue Exception # rubocop:disable Lint/RescueException
      exit!(1)
    end
    server.close
    [supervisor, port]
  end

  # A worker's accept loop: a fiber per connection until the listener closes (the worker was told
  # to stop); the requests in flight finish.
  def serve(worker, listener)
    until worker.stopping?
      client, = listener.accept # a Socket's accept gives [client, address]
      Fiber.schedule { answer(client) }
    end
  rescue IOError
    nil
  end

  def answer(client)
    while (line = client.gets)
      case line.chomp
      when "pid" then client.puts(Process.pid)
      when "slow"
        sleep 0.3
        client.puts("done #{Process.pid}")
      when "crash" then exit!(3)
      end
    end
  ensure
    client.close
  end

  # Pids answering, once the workers accept: a connection may meet a worker still starting.
  def worker_pids(port, tries: 40)
    Array.new(tries) { ask(port, "pid") }.map(&:to_i).uniq
  end

  def test_the_workers_are_processes_of_their_own_serving_one_socket
    supervisor, port = start_supervisor(count: 2)
    pids = worker_pids(port)
    refute_empty pids
    refute_includes pids, Process.pid
    refute_includes pids, supervisor
    assert_operator pids.size, :<=, 2
  ensure
    assert stop(supervisor).success? if supervisor
  end

  def test_a_worker_that_dies_is_started_again
    supervisor, port = start_supervisor(count: 1)
    first = ask(port, "pid").to_i
    assert_nil ask(port, "crash") # the worker ends without answering
    second = nil
    Timeout.timeout(10) do
      second = begin
        ask(port, "pid").to_i
      rescue Errno::ECONNRESET, Errno::EPIPE
        nil
      end until second && second != first
    end
    refute_equal first, second
  ensure
    assert stop(supervisor).success? if supervisor
  end

  # The block's exception ends the worker (its watchers included), and the supervisor starts
  # another: here the first worker fails before it accepts anything.
  def test_a_worker_whose_block_raises_is_started_again
    Dir.mktmpdir do |dir|
      marker = File.join(dir, "failed once")
      server = TCPServer.new("127.0.0.1", 0)
      port = server.local_address.ip_port
      supervisor = fork do
        $stderr.reopen(File::NULL) # the failed worker's report
        Evt::Workers.new(count: 1, listeners: [server], stop_timeout: 5).run do |worker|
          unless File.exist?(marker)
            File.write(marker, "")
            raise "the first worker fails"
          end
          serve(worker, server)
        end
        exit!(0)
      end
      server.close
      pid = nil
      Timeout.timeout(15) do
        pid = begin
          ask(port, "pid").to_i
        rescue Errno::ECONNRESET, Errno::EPIPE
          nil
        end until pid&.positive?
      end
      assert File.exist?(marker), "the first worker never ran"
      assert_operator pid, :positive?
    ensure
      assert stop(supervisor).success? if supervisor
    end
  end

  # A worker that cannot boot is started again after a back-off that doubles (0.1, 0.2, 0.4 s...),
  # not forked again and again at full speed. The supervisor says so on its stderr, and still stops
  # on SIGTERM.
  def test_a_worker_that_fails_at_boot_is_started_again_after_a_growing_pause
    Dir.mktmpdir do |dir|
      starts = File.join(dir, "starts")
      log = File.join(dir, "stderr")
      server = TCPServer.new("127.0.0.1", 0)
      supervisor = fork do
        $stderr.reopen(log, "w")
        Evt::Workers.new(count: 1, listeners: [server], stop_timeout: 5).run do |_worker|
          File.write(starts, "#{Process.clock_gettime(Process::CLOCK_MONOTONIC)}\n", mode: "a")
          raise "cannot boot"
        end
        exit!(0)
      end
      server.close
      Timeout.timeout(10) { sleep 0.05 until File.exist?(starts) && File.readlines(starts).size >= 4 }
      times = File.readlines(starts).map { |line| Float(line) }
      # Pauses of 0.1, 0.2 and 0.4 s before the second, third and fourth starts.
      assert_operator times[3] - times[0], :>=, 0.5, "4 starts in #{(times[3] - times[0]).round(3)} s of a worker that cannot boot"
      gaps = times.each_cons(2).map { |a, b| b - a }
      assert_operator gaps[2], :>, gaps[0], "the pauses did not grow: #{gaps.map { |g| g.round(3) }}"
      assert_match(/worker 0 ended \d+ time\(s\) in a row within 5 s of its start; starting it again in/, File.read(log))
    ensure
      assert stop(supervisor).success? if supervisor
    end
  end

  def test_sigterm_lets_the_requests_in_flight_finish
    supervisor, port = start_supervisor(count: 1)
    worker = ask(port, "pid").to_i
    socket = TCPSocket.new("127.0.0.1", port)
    socket.puts("slow")
    sleep 0.05 # not a synchronisation: the request is in flight on either side of it
    Process.kill("TERM", supervisor)
    assert_equal "done #{worker}", Timeout.timeout(10) { socket.gets&.chomp }
    socket.close
    _, status = Timeout.timeout(20) { Process.wait2(supervisor) }
    assert status.success?
    assert_raises(Errno::ECONNREFUSED) { TCPSocket.new("127.0.0.1", port).close }
    supervisor = nil
  ensure
    stop(supervisor) if supervisor
  end

  def test_sighup_replaces_the_workers_one_at_a_time_losing_no_connection
    supervisor, port = start_supervisor(count: 2)
    before = worker_pids(port)
    Process.kill("HUP", supervisor)
    answers = []
    Timeout.timeout(15) do
      answers << ask(port, "pid").to_i until (answers.last(10) & before).empty? && answers.size >= 10
    end
    refute(answers.any?(&:zero?), "a connection was lost during the restart")
  ensure
    assert stop(supervisor).success? if supervisor
  end

  # docs/workers.md's recipe for an even split: each worker listens on a socket of its own at one
  # port (SO_REUSEPORT), and Linux spreads connections over them by their addresses' hash, however
  # fast they come. 40 connections opened at once, held: both workers have some (a hash putting all
  # 40 on one socket is a chance of one in 2^39).
  def test_workers_with_sockets_of_their_own_at_one_port_share_a_burst_of_connections
    skip "SO_REUSEPORT spreads connections on Linux only" unless RUBY_PLATFORM.include?("linux")

    holder = reuse_port_socket(0) # holds the port, bound and not listening
    port = holder.local_address.ip_port
    supervisor = fork do
      Evt::Workers.new(count: 2, stop_timeout: 5).run do |worker|
        listener = reuse_port_socket(port)
        listener.listen(64)
        worker.on_stop { listener.close }
        serve(worker, listener)
      end
      exit!(0)
    rescue Exception # rubocop:disable Lint/RescueException
      exit!(1)
    end
    Timeout.timeout(10) { sleep 0.01 until listening(port) == 2 }
    sockets = Array.new(40) { TCPSocket.new("127.0.0.1", port) }
    pids = Timeout.timeout(10) { sockets.map { |socket| socket.puts("pid") || socket.gets.to_i } }
    assert_equal 2, pids.uniq.size, "the 40 connections went to #{pids.tally} (worker pid => connections)"
  ensure
    sockets&.each(&:close)
    assert stop(supervisor).success? if supervisor
    holder&.close
  end

  # A TCP socket with SO_REUSEPORT, bound to `port` on 127.0.0.1 (0: one the kernel picks).
  def reuse_port_socket(port)
    Socket.new(:INET, :STREAM).tap do |socket|
      socket.setsockopt(:SOCKET, :REUSEPORT, true)
      socket.bind(Addrinfo.tcp("127.0.0.1", port))
    end
  end

  # The sockets listening on `port` (IPv4), from the kernel's table ("0A": TCP_LISTEN).
  def listening(port)
    File.readlines("/proc/net/tcp").count { |line| line.split.then { |f| f[1]&.end_with?(format(":%04X", port)) && f[3] == "0A" } }
  end
end
