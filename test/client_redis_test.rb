# frozen_string_literal: true

require "test_helper"
require "open3"
require_relative "support/servers"

begin
  require "redis-client"
  require "redis"
  require "connection_pool"
rescue LoadError => e
  REDIS_GEMS_MISSING = e.message
end

# redis-client (its pure-Ruby driver) and the redis gem under evt against a real redis-server: many
# fibers through a connection pool, big values, blocking pops with and without a timeout, pub/sub.
# Each test also shows the fibers overlap: waits that would take N x t one after another end in
# about t.
class ClientRedisTest < Minitest::Test
  def setup
    skip "the redis gems are not installed (bundle install): #{REDIS_GEMS_MISSING}" if defined?(REDIS_GEMS_MISSING)
    @server = Servers.redis(self)
    @config = RedisClient.config(host: "127.0.0.1", port: @server.port, driver: :ruby)
    @prefix = "evt:#{name}:#{Process.pid}:"
  end

  def key(suffix) = "#{@prefix}#{suffix}"

  def test_hundreds_of_concurrent_gets_and_sets_through_a_pool
    values = {}
    evt do
      pool = @config.new_pool(size: 20, timeout: 5)
      300.times do |i|
        Fiber.schedule do
          pool.call("SET", key(i), "value #{i}")
          values[i] = pool.call("GET", key(i))
        end
      end
    end
    assert_equal(300.times.to_h { |i| [i, "value #{i}"] }, values)
  end

  def test_big_values_round_trip
    big = Random.new(42).bytes(4 * 1024 * 1024)
    results = []
    evt do
      pool = @config.new_pool(size: 4, timeout: 5)
      4.times do |i|
        Fiber.schedule do
          pool.call("SET", key("big#{i}"), big + i.to_s)
          results << (pool.call("GET", key("big#{i}")) == (big + i.to_s).b)
        end
      end
    end
    assert_equal [true] * 4, results
  end

  # BLPOP with a timeout: 20 fibers each wait 0.3 s on a connection of their own, at once.
  def test_blpop_timeouts_overlap
    results = []
    took = elapsed do
      evt do
        pool = @config.new_pool(size: 20, timeout: 5)
        20.times do |i|
          Fiber.schedule { results << pool.blocking_call(2, "BLPOP", key("empty#{i}"), 0.3) }
        end
      end
    end
    assert_equal [nil] * 20, results
    assert_operator took, :<, 3.0, "20 BLPOPs of 0.3 s took #{took} s: they did not overlap"
  end

  # BLPOP without a timeout, ended by a push from another fiber; meanwhile the loop serves others.
  def test_blpop_without_a_timeout_wakes_on_a_push
    popped = nil
    ticks = 0
    evt do
      client = @config.new_client
      pusher = @config.new_client
      Fiber.schedule { popped = client.blocking_call(nil, "BLPOP", key("queue"), 0) }
      Fiber.schedule do
        5.times do
          ticks += 1
          sleep 0.01
        end
        pusher.call("RPUSH", key("queue"), "job")
      end
    end
    assert_equal [key("queue"), "job"], popped
    assert_equal 5, ticks
  end

  def test_a_read_timeout_raises_and_the_pool_goes_on
    error = nil
    after = nil
    evt do
      client = @config.new_client(read_timeout: 0.1)
      begin
        client.blocking_call(0.1, "BLPOP", key("never"), 0)
      rescue RedisClient::ReadTimeoutError => e
        error = e
      end
      after = client.call("PING") # reconnects
    end
    assert_kind_of RedisClient::ReadTimeoutError, error
    assert_equal "PONG", after
  end

  def test_pubsub_messages_reach_every_subscriber
    received = Hash.new { |h, k| h[k] = [] }
    evt do
      ready = Thread::Queue.new
      3.times do |i|
        Fiber.schedule do
          pubsub = @config.new_client.pubsub
          pubsub.call("SUBSCRIBE", key("channel"))
          pubsub.next_event(5) # the subscribe confirmation
          ready << i
          while (event = pubsub.next_event(5))
            break if event.last == "stop"

            received[i] << event.last if event.first == "message"
          end
          pubsub.close
        end
      end
      Fiber.schedule do
        3.times { ready.pop }
        publisher = @config.new_client
        %w[a b c stop].each { |message| publisher.call("PUBLISH", key("channel"), message) }
      end
    end
    assert_equal({0 => %w[a b c], 1 => %w[a b c], 2 => %w[a b c]}, received)
  end

  # hiredis-client waits with rb_thread_fd_select, which Ruby hands to no scheduler: a BLPOP stops
  # the whole loop (a ticking fiber does not tick). evt says so once, and the pure-Ruby driver is
  # the answer. In a process of its own: loading hiredis-client makes it redis-client's default.
  def test_hiredis_stops_the_loop_and_evt_warns_once
    script = <<~RUBY
      require "evt"
      require "hiredis-client"
      ticks = {}
      2.times do
        Evt.run do
          %i[hiredis ruby].each do |driver|
            client = RedisClient.config(host: "127.0.0.1", port: #{@server.port}, driver: driver).new_client
            done = false
            ticks[driver] = 0
            Fiber.schedule { until done; ticks[driver] += 1; sleep 0.01; end }
            client.blocking_call(2, "BLPOP", "#{key("hiredis-empty")}", 0.3)
            done = true
          end
        end
      end
      puts ticks.values.join(" ")
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", "-e", script)
    assert status.success?, err
    hiredis_ticks, ruby_ticks = out.split.map(&:to_i)
    assert_operator hiredis_ticks, :<=, 2, "the loop ran during hiredis's BLPOP: is the warning still true?"
    assert_operator ruby_ticks, :>=, 10
    assert_equal 1, err.scan("hiredis-client's driver waits for Redis with rb_thread_fd_select").size, err
  end

  # The redis gem (built on redis-client), with its own blocking commands.
  def test_the_redis_gem
    results = []
    took = elapsed do
      evt do
        pool = ConnectionPool.new(size: 10, timeout: 5) { Redis.new(host: "127.0.0.1", port: @server.port) }
        10.times do |i|
          Fiber.schedule do
            pool.with do |redis|
              redis.set(key("gem#{i}"), i)
              results << [redis.get(key("gem#{i}")), redis.blpop(key("gem-empty#{i}"), timeout: 0.3)]
            end
          end
        end
      end
    end
    assert_equal(10.times.map { |i| [i.to_s, nil] }.sort, results.sort)
    assert_operator took, :<, 2.0, "10 BLPOPs of 0.3 s took #{took} s: they did not overlap"
  end
end
