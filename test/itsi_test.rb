# frozen_string_literal: true

require "test_helper"
require "net/http"
require "rbconfig"
require_relative "support/limited_run"

# Itsi (the itsi-server gem, a Rack server written in Rust) with `fiber_scheduler "Evt::Scheduler"`,
# run as its users run it: the `itsi` command, in a process of its own, on whatever backend
# EVT_BACKEND selects (EVT_NO_EXTENSION too: the environment is inherited).
#
# Itsi drives the scheduler from its own code: each worker thread runs one fiber that takes requests
# from Rust's queue and starts a fiber for each (Fiber.schedule); between batches it calls block
# (a thread of Itsi's unblocks it when requests come in) or, while requests are still queued,
# `scheduler.yield`, a method Async's and Itsi's schedulers have beside Ruby's hooks. Without it in
# evt, the NoMethodError silently ended that fiber: every later request went unanswered.
class ItsiTest < Minitest::Test
  ROUNDS = 30
  CONCURRENCY = 10
  PAUSE = 0.05 # seconds a sleeping request sleeps
  TIMEOUT = 20 # for one request, for the server to start, and for it to stop: generous

  ITSI_RB = <<~'RUBY'
    require "evt"
    workers 1
    threads 1
    fiber_scheduler "Evt::Scheduler"
    bind "http://127.0.0.1:#{ENV.fetch("ITSI_TEST_PORT")}"
    rackup_file "config.ru"
    log_level :warn
    # Tells the test the listener is bound: it waits for this line, not for a time.
    after_start do
      ready = IO.for_fd(Integer(ENV.fetch("ITSI_TEST_READY_FD")), autoclose: true)
      ready.puts("ready")
      ready.close
    end
  RUBY

  # /fast/ID and /sleep/ID answer with the ID; /wait blocks on a queue until a /release/ID, and
  # /waiting says how many requests wait there.
  CONFIG_RU = <<~'RUBY'
    queue = Thread::Queue.new
    run lambda { |env|
      _, kind, id = env["PATH_INFO"].split("/")
      body =
        case kind
        when "fast" then "fast #{id}"
        when "sleep" then sleep(Float(ENV.fetch("ITSI_TEST_PAUSE"))) && "slept #{id}"
        when "wait" then "waited for #{queue.pop}"
        when "release" then queue.push(id) && "released #{id}"
        when "waiting" then queue.num_waiting.to_s
        else "unknown #{kind}"
        end
      [200, { "content-type" => "text/plain" }, [body]]
    }
  RUBY

  def setup
    @itsi = Gem.bin_path("itsi-server", "itsi")
  rescue LoadError, Gem::Exception => e
    skip "itsi-server is not installed (the Gemfile's group :itsi installs it where RubyGems has " \
         "it precompiled): #{e.message}"
  end

  def test_every_request_of_many_concurrent_rounds_is_answered
    with_itsi do |port|
      ROUNDS.times do |round|
        paths = Array.new(CONCURRENCY) { |i| i.even? ? "/sleep/#{round}-#{i}" : "/fast/#{round}-#{i}" }
        expected = paths.to_h { |path| [path, "#{path.start_with?("/sleep") ? "slept" : "fast"} #{path.split("/").last}"] }
        answers = paths.map { |path| Thread.new { [path, get(port, path)] } }.to_h(&:value)
        assert_equal expected, answers, "round #{round} of #{ROUNDS}: requests unanswered\n#{server_log}"
      end
    end
  end

  # A request blocked in the app (Queue#pop: block) leaves the worker's one thread free for the
  # others, one of which unblocks it (Queue#push: unblock). The server is then killed, not asked to
  # stop: after this exchange Itsi's own shutdown sometimes never ends, with Async::Scheduler as
  # with evt's (one run in 3 to 9 beside a CPU hog here). Its request-pulling fiber blocks again
  # after the wake for the shutdown, and its waker thread sends no further unblock. The other test
  # checks that Itsi stops cleanly on SIGTERM under evt.
  def test_a_request_waiting_for_another_one_is_answered_when_that_one_comes
    with_itsi(stop: false) do |port|
      waiter = Thread.new { get(port, "/wait") }
      deadline = monotonic + TIMEOUT
      until (waiting = get(port, "/waiting")) == "1" || !waiter.alive?
        flunk "the /wait request never waited in the app (/waiting: #{waiting})\n#{server_log}" if monotonic > deadline
      end
      assert_equal "released x", get(port, "/release/x")
      assert_equal "waited for x", waiter.value, server_log
    end
  end

  private

  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: TIMEOUT, read_timeout: TIMEOUT) { |http| http.get(path).body }
  rescue StandardError => e
    "#{e.class}: #{e.message}"
  end

  def server_log
    "server's output:\n#{File.read(@log).lines.last(40).join}"
  rescue SystemCallError
    ""
  end

  # Starts Itsi on a free loopback port, yields that port, stops the server with SIGTERM and checks
  # that it ended well (`stop`; else it is killed). The process group goes in any case.
  def with_itsi(stop: true)
    Dir.mktmpdir("evt-itsi") do |dir|
      File.write(File.join(dir, "Itsi.rb"), ITSI_RB)
      File.write(File.join(dir, "config.ru"), CONFIG_RU)
      @log = File.join(dir, "itsi.log")
      pid, port = start_itsi(dir)
      begin
        yield port
        next unless stop

        Process.kill("TERM", pid)
        # Three times the others: under bin/test --asan (libasan preloaded) one stop took longer than 20 s.
        _, status = begin
          Timeout.timeout(TIMEOUT * 3) { Process.wait2(pid) }
        rescue Timeout::Error
          # Where each of its processes waits, before they are killed: in a fork stuck in libasan or
          # in Ruby 3.4 (docs/testing.md), or in Itsi's own shutdown.
          listing = LimitedRun.processes(pid).dup.force_encoding(Encoding::UTF_8).scrub
          flunk "Itsi did not end #{TIMEOUT * 3} s after SIGTERM\n#{listing}\n#{server_log}"
        end
        pid = nil
        assert status.success?, "Itsi ended with #{status.inspect} on SIGTERM\n#{server_log}"
      ensure
        kill_group(pid) if pid
      end
    end
  end

  # Kills the server's process group and reaps the server.
  def kill_group(pid)
    Process.kill("KILL", -pid)
  rescue Errno::ESRCH
    nil
  ensure
    Process.wait(pid)
  end

  # [pid, port] once the server listens. A port taken between the choice and Itsi's bind (Itsi
  # then exits before it is ready) is chosen again.
  def start_itsi(dir)
    3.times do
      port = TCPServer.open("127.0.0.1", 0) { |server| server.local_address.ip_port }
      reader, writer = IO.pipe
      env = { "ITSI_TEST_PORT" => port.to_s, "ITSI_TEST_READY_FD" => writer.fileno.to_s,
              "ITSI_TEST_PAUSE" => PAUSE.to_s,
              "RUBYLIB" => [File.expand_path("../lib", __dir__), ENV.fetch("RUBYLIB", nil)].compact.join(File::PATH_SEPARATOR) }
      pid = Process.spawn(env, RbConfig.ruby, @itsi, "-C", "Itsi.rb",
                          chdir: dir, pgroup: true, writer => writer, %i[out err] => [@log, "w"])
      writer.close
      ready = reader.wait_readable(TIMEOUT) && reader.gets
      reader.close
      return [pid, port] if ready == "ready\n"

      kill_group(pid)
      flunk "Itsi did not start (it ended, or took over #{TIMEOUT} s)\n#{server_log}" if ready.nil? && !File.read(@log).include?("in use")
    end
    flunk "Itsi could not bind a free port three times\n#{server_log}"
  end
end
