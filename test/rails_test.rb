# frozen_string_literal: true

require "test_helper"
require "json"
require "net/http"
require "open3"
require_relative "support/servers"
require_relative "support/http_peer"

begin
  require "pg"
rescue LoadError => e
  RAILS_PG_MISSING = e.message
end

# The Rails application apps/rails/app.rb (API-only, ActiveRecord on PostgreSQL, fiber isolation)
# served by Falcon on evt's selector, on this run's backend, as an application switches to it
# (IO_EVENT_SELECTOR=Evt, RUBYOPT -revt/async); Puma serves the same app where a test compares.
# Its gems come from apps/rails/Gemfile, which bin/setup installs into the cache; without them, or
# without PostgreSQL, the tests skip saying why.
class RailsTest < Minitest::Test
  ROOT = File.expand_path("..", __dir__)
  GEMFILE = File.join(ROOT, "apps/rails/Gemfile")
  GEMS = File.join(ENV.fetch("XDG_CACHE_HOME") { File.join(Dir.home, ".cache") }, "evt", "rails-gems")
  # ActiveRecord's pool, smaller than the requests some tests make at once.
  POOL = 4

  # The app's servers, one of each kind per test process, stopped when the tests end.
  module Apps
    Server = Struct.new(:kind, :pid, :port, :line, :stdout, :log, keyword_init: true)

    @servers = {}
    @lock = Mutex.new

    class << self
      # Why the app cannot run here, or nil.
      def missing
        @lock.synchronize do
          return @missing if defined?(@missing)

          @missing = if defined?(RAILS_PG_MISSING)
                       "pg is not installed (bundle install): #{RAILS_PG_MISSING}"
                     elsif !Evt.extension?
                       "Falcon on evt takes evt's selector, which needs the C extension: this run is without it"
                     else
                       out, status = Open3.capture2e(bundle_env, RbConfig.ruby, "-S", "bundle", "check")
                       "apps/rails/Gemfile's gems are not installed (bin/setup installs them into #{GEMS}): " \
                         "#{out.lines.last&.strip}" unless status.success?
                     end
        end
      end

      def bundle_env
        # Not the variables of the `bundle exec` this test runs under (BUNDLE_LOCKFILE would name evt's lock).
        {"BUNDLE_GEMFILE" => GEMFILE, "BUNDLE_PATH" => GEMS, "BUNDLE_FROZEN" => "true", "BUNDLE_LOCKFILE" => nil,
         "BUNDLER_SETUP" => nil, "BUNDLE_BIN_PATH" => nil, "RUBYOPT" => nil, "RUBYLIB" => nil}
      end

      # kind: :falcon (on evt's selector, this run's backend) or :puma (POOL threads).
      def server(kind, postgres:, redis:, upstream:)
        @lock.synchronize do
          @servers[kind] ||= start(kind, postgres, redis, upstream)
        end
      end

      def stop_all
        @servers.each_value do |server|
          Process.kill(:KILL, server.pid)
          server.stdout.close
        rescue Errno::ESRCH
          nil
        end
        @servers.clear
      end

      private

      def start(kind, postgres, redis, upstream)
        env = bundle_env.merge(
          "RAILS_ENV" => "production", "RAILS_POOL" => POOL.to_s, "RAILS_LOG_LEVEL" => "error",
          "DATABASE_URL" => "postgres://evt@127.0.0.1:#{postgres.port}/postgres",
          "REDIS_URL" => "redis://127.0.0.1:#{redis.port}", "UPSTREAM_URL" => "http://127.0.0.1:#{upstream.port}/upstream",
          "CONSOLE_LEVEL" => "fatal"
        )
        command = [RbConfig.ruby, File.join(ROOT, "apps/rails/serve.rb")]
        if kind == :falcon
          env.merge!("IO_EVENT_SELECTOR" => "Evt", "RUBYOPT" => "-rbundler/setup -I#{ROOT}/lib -revt/async")
          command << "falcon"
        else
          command += ["puma", POOL.to_s]
        end
        log = File.join(Dir.tmpdir, "evt-rails-#{kind}-#{Process.pid}.log")
        stdout = IO.popen(env, command, err: log)
        line = Timeout.timeout(60) { stdout.gets }
        raise "the #{kind} server did not start: #{File.read(log)[-3000..] || File.read(log)}" unless line

        Server.new(kind: kind, pid: stdout.pid, port: Integer(line[/listening on (\d+)/, 1]), line: line, stdout: stdout, log: log)
      end
    end

    owner = Process.pid
    Minitest.after_run { stop_all if Process.pid == owner }
  end

  def setup
    reason = Apps.missing
    skip reason if reason
    @postgres = Servers.postgres(self)
    @redis = Servers.redis(self)
  end

  def upstream
    self.class.instance_variable_get(:@upstream) || self.class.instance_variable_set(:@upstream, HttpPeer.new)
  end

  def falcon = Apps.server(:falcon, postgres: @postgres, redis: @redis, upstream: upstream)
  def puma = Apps.server(:puma, postgres: @postgres, redis: @redis, upstream: upstream)

  def get(server, path, timeout: 10)
    Net::HTTP.start("127.0.0.1", server.port, open_timeout: timeout, read_timeout: timeout) do |http|
      response = http.get(path)
      [response.code.to_i, response.body]
    end
  end

  def get_json(server, path)
    status, body = get(server, path)
    assert_equal 200, status, "GET #{path}: #{body}"
    JSON.parse(body)
  end

  # +count+ GETs at once, each a fiber of this process's own Evt.run: [[status, body]...] in order.
  def concurrently(server, paths)
    results = Array.new(paths.size)
    evt(timeout: 60) do
      paths.each_with_index { |path, i| Fiber.schedule { results[i] = get(server, path) } }
    end
    results
  end

  # Waits (polling, 10 s at most) until the block is true; fails with +message+ otherwise.
  def wait_until(message, timeout: 10)
    deadline = monotonic + timeout
    until (value = yield)
      flunk "#{message} (after #{timeout} s)" if monotonic > deadline
      sleep 0.02
    end
    value
  end

  def test_falcon_runs_on_evts_selector_with_this_runs_backend
    backend = Evt::Scheduler.new.tap(&:close).backend
    assert_match(/\(selector #<Evt::Selector #{backend}\b/, falcon.line)
  end

  def test_every_endpoint_answers
    server = falcon
    assert_equal [200, "ok"], get(server, "/instant")
    assert_equal [200, "db"], get(server, "/db")
    remote = get_json(server, "/remote")
    assert_equal "/upstream", remote["upstream"]
    assert_kind_of Integer, remote["count"]
    assert_equal [200, 5.times.map { |i| "chunk #{i}\n" }.join], get(server, "/stream")
  end

  # Twelve requests whose queries wait 0.2 s in PostgreSQL, with a pool of four: three rounds of
  # four at once (about 0.6 s), where one at a time would take 2.4 s. The pool opening all four
  # connections shows they overlapped (it opens one only when every open one is busy); the time,
  # under one at a time's, only bounds it (generously: ASan and a loaded machine slow it down).
  # Then every connection is back.
  def test_queries_overlap_with_a_pool_smaller_than_the_requests
    server = falcon
    results = nil
    took = elapsed { results = concurrently(server, ["/db?sleep=0.2"] * 12) }
    assert_equal [[200, "db"]] * 12, results
    assert_operator took, :<, 2.3, "twelve 0.2 s queries over a pool of #{POOL} took #{took} s: they did not overlap"
    stat = wait_until("the pool's connections did not come back") do
      s = get_json(server, "/pool")
      s if s["busy"].zero?
    end
    assert_equal POOL, stat["connections"], "the pool never had #{POOL} queries at once"
    assert_equal 0, stat["waiting"]
  end

  # Clients that send a request and leave while its query runs: the query ends, its connection
  # returns to the pool, the server's descriptors go back to what they were, and it still answers.
  def test_a_client_that_disconnects_mid_request_leaves_nothing_behind
    server = falcon
    # Every connection of the pool open first: those stay, and are not what this test looks for.
    concurrently(server, ["/db?sleep=0.1"] * POOL)
    wait_until("the pool's connections did not come back") { get_json(server, "/pool")["busy"].zero? }
    descriptors = -> { Dir.children("/proc/#{server.pid}/fd").size }
    before = descriptors.call
    pg = PG.connect(host: "127.0.0.1", port: @postgres.port, user: "evt", dbname: "postgres")
    running = -> { pg.exec("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep(0.5)%' AND pid <> pg_backend_pid()").getvalue(0, 0).to_i }
    clients = 3.times.map do
      TCPSocket.new("127.0.0.1", server.port).tap { |s| s.write("GET /db?sleep=0.5 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") }
    end
    wait_until("the queries did not start") { running.call == 3 }
    clients.each(&:close)
    wait_until("the queries did not end") { running.call.zero? }
    wait_until("the pool's connections did not come back") { get_json(server, "/pool")["busy"].zero? }
    wait_until("the server kept descriptors: #{before} before, #{descriptors.call} after") { descriptors.call <= before }
    assert_equal [200, "ok"], get(server, "/instant")
  ensure
    pg&.close
  end

  def test_current_attributes_start_empty_and_stay_with_their_request
    results = concurrently(falcon, 10.times.map { |i| "/current?id=r#{i}&pause=0.05" })
    results.each_with_index do |(status, body), i|
      assert_equal 200, status
      assert_equal({"before" => nil, "after" => "r#{i}"}, JSON.parse(body))
    end
  end

  def test_isolated_execution_state_is_per_fiber
    results = concurrently(falcon, 10.times.map { |i| "/isolation?id=s#{i}&pause=0.05" })
    results.each_with_index do |(status, body), i|
      assert_equal 200, status
      assert_equal({"level" => "fiber", "before" => nil, "mine" => "s#{i}", "child" => nil}, JSON.parse(body))
    end
  end

  # The same outcome as under Puma: Timeout.timeout ends the 2 s query at 0.1 s with Timeout::Error,
  # statement_timeout with ActiveRecord::QueryCanceled, and the pool's next connection works.
  def test_timeout_and_statement_timeout_as_under_puma
    outcomes = [falcon, puma].to_h do |server|
      [server.kind, %w[/timeout /statement_timeout].to_h { |path| [path, get_json(server, path)] }]
    end
    outcomes.each do |kind, by_path|
      by_path.each { |path, outcome| assert_operator outcome["took"], :<, 1.5, "#{kind} #{path}: #{outcome}" }
    end
    strip = ->(by_path) { by_path.transform_values { |outcome| outcome.except("took") } }
    assert_equal({"/timeout" => {"error" => "Timeout::Error", "after" => 1},
                  "/statement_timeout" => {"error" => "ActiveRecord::QueryCanceled", "after" => 1}}, strip.(outcomes[:puma]))
    assert_equal strip.(outcomes[:puma]), strip.(outcomes[:falcon])
    assert_equal 0, get_json(falcon, "/pool")["busy"]
  end

  # The chunks come as they are made: the first long before the last.
  def test_a_streamed_response_arrives_chunk_by_chunk
    server = falcon
    arrivals = []
    body = +""
    Net::HTTP.start("127.0.0.1", server.port, read_timeout: 10) do |http|
      http.request_get("/stream?count=3&pause=0.3") do |response|
        response.read_body do |chunk|
          arrivals << monotonic
          body << chunk
        end
      end
    end
    assert_equal "chunk 0\nchunk 1\nchunk 2\n", body
    assert_operator arrivals.last - arrivals.first, :>=, 0.4, "the chunks came together: the response was buffered"
  end
end
