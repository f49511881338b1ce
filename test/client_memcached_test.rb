# frozen_string_literal: true

require "test_helper"
require_relative "support/servers"

begin
  require "dalli"
  require "connection_pool"
rescue LoadError => e
  DALLI_MISSING = e.message
end

# dalli under evt against a real memcached: many fibers through a pool, big values, and fibers
# overlapping while memcached answers.
class ClientMemcachedTest < Minitest::Test
  def setup
    skip "dalli is not installed (bundle install): #{DALLI_MISSING}" if defined?(DALLI_MISSING)
    @server = Servers.memcached(self)
    @prefix = "evt:#{name}:#{Process.pid}:"
    Dalli.logger.level = Logger::WARN
  end

  def client
    Dalli::Client.new("127.0.0.1:#{@server.port}", socket_timeout: 5)
  end

  def test_concurrent_sets_and_gets_through_a_pool
    values = {}
    evt do
      pool = ConnectionPool.new(size: 10, timeout: 5) { client }
      200.times do |i|
        Fiber.schedule do
          pool.with { |dc| dc.set("#{@prefix}#{i}", "value #{i}") }
          values[i] = pool.with { |dc| dc.get("#{@prefix}#{i}") }
        end
      end
    end
    assert_equal(200.times.to_h { |i| [i, "value #{i}"] }, values)
  end

  def test_big_values_and_multi_get
    big = "x" * 500_000
    result = nil
    evt do
      dc = client
      3.times { |i| dc.set("#{@prefix}big#{i}", big + i.to_s) }
      result = dc.get_multi(*3.times.map { |i| "#{@prefix}big#{i}" })
    end
    assert_equal(3.times.to_h { |i| ["#{@prefix}big#{i}", big + i.to_s] }, result)
  end

  # Each fiber's connection waits for memcached while a ticking fiber keeps running: 50 fibers
  # and the ticker share the loop.
  def test_the_loop_runs_while_fibers_wait_for_memcached
    ticks = 0
    done = 0
    client.set("#{@prefix}counter", "0", nil, raw: true)
    evt do
      running = true
      Fiber.schedule do
        while running
          ticks += 1
          sleep 0.001
        end
      end
      fibers = 50.times.map do |i|
        Fiber.schedule do
          dc = client
          20.times { |j| dc.incr("#{@prefix}counter", 1) || raise("incr #{i}/#{j} failed") }
          done += 1
        end
      end
      Fiber.schedule do
        sleep 0.001 until done == fibers.size
        running = false
      end
    end
    assert_equal 50, done
    assert_equal 1000, client.get("#{@prefix}counter", raw: true).to_i
    assert_operator ticks, :>, 0
  end
end
