# frozen_string_literal: true

require "test_helper"
require_relative "support/servers"

begin
  require "pg"
  require "connection_pool"
  require "sequel"
rescue LoadError => e
  PG_MISSING = e.message
end

# pg (libpq's asynchronous API, which waits through the scheduler) and Sequel under evt against a
# real PostgreSQL: concurrent queries from a pool, COPY, LISTEN/NOTIFY, advisory locks,
# statement_timeout, a query cancelled by Timeout.timeout. Queries of pg_sleep show the fibers
# overlap: ten 0.3 s queries end in about 0.3 s.
class ClientPgTest < Minitest::Test
  include PoolOverlap
  def setup
    skip "pg or sequel is not installed (bundle install): #{PG_MISSING}" if defined?(PG_MISSING)
    @server = Servers.postgres(self)
  end

  def params = {host: "127.0.0.1", port: @server.port, user: "evt", dbname: "postgres"}

  def connect = PG.connect(**params)

  def test_concurrent_queries_from_a_pool_overlap
    assert_pooled_queries_overlap(method(:connect)) do |conn, i|
      conn.exec_params("SELECT $1::int AS n, pg_sleep(0.3)", [i]).getvalue(0, 0).to_i
    end
  end

  def test_copy_in_and_out
    rows = nil
    evt do
      conn = connect
      conn.exec("CREATE TEMP TABLE items (id int, name text)")
      conn.copy_data("COPY items FROM STDIN") do
        2000.times { |i| conn.put_copy_data("#{i}\titem #{i}\n") }
      end
      rows = +""
      conn.copy_data("COPY (SELECT * FROM items ORDER BY id) TO STDOUT") do
        while (row = conn.get_copy_data)
          rows << row
        end
      end
      conn.close
    end
    assert_equal 2000.times.map { |i| "#{i}\titem #{i}\n" }.join, rows
  end

  def test_listen_and_notify_wake_the_waiting_fiber
    payloads = []
    ticks = 0
    evt do
      listener = connect
      listener.exec("LISTEN evt_channel")
      notifier = connect
      Fiber.schedule do
        3.times { listener.wait_for_notify(5) { |_channel, _pid, payload| payloads << payload } }
      end
      Fiber.schedule do
        %w[one two three].each do |payload|
          sleep 0.02
          ticks += 1
          notifier.exec_params("SELECT pg_notify('evt_channel', $1)", [payload])
        end
      end
    end
    assert_equal %w[one two three], payloads
    assert_equal 3, ticks
  end

  # An advisory lock held by one connection: the other's pg_advisory_lock waits in the server
  # until the first lets go, and meanwhile the loop runs the first fiber.
  def test_advisory_locks_wait_for_each_other
    order = []
    evt do
      first = connect
      second = connect
      first.exec("SELECT pg_advisory_lock(4242)")
      Fiber.schedule do
        second.exec("SELECT pg_advisory_lock(4242)")
        order << :second_locked
        second.exec("SELECT pg_advisory_unlock(4242)")
      end
      Fiber.schedule do
        sleep 0.1
        order << :first_unlocks
        first.exec("SELECT pg_advisory_unlock(4242)")
      end
    end
    assert_equal %i[first_unlocks second_locked], order
  end

  def test_statement_timeout_cancels_in_the_server
    error = nil
    evt do
      conn = connect
      conn.exec("SET statement_timeout = 100")
      error = assert_raises(PG::QueryCanceled) { conn.exec("SELECT pg_sleep(5)") }
      assert_equal "1", conn.exec("SELECT 1").getvalue(0, 0)
    end
    assert_match(/statement timeout/, error.message)
  end

  # Timeout.timeout around a query: pg cancels it in the server and the connection stays usable.
  def test_timeout_cancels_a_query_and_the_connection_goes_on
    took = nil
    after = nil
    evt do
      conn = connect
      took = elapsed do
        assert_raises(Timeout::Error) { Timeout.timeout(0.2) { conn.exec("SELECT pg_sleep(5)") } }
      end
      after = conn.exec("SELECT 2").getvalue(0, 0)
    end
    assert_operator took, :<, 3, "Timeout.timeout(0.2) took #{took} s"
    assert_equal "2", after
  end

  # Sequel with its fiber_concurrency extension: a connection per fiber from Sequel's pool.
  def test_sequel_with_fiber_concurrency
    Sequel.extension :fiber_concurrency
    results = []
    took = elapsed do
      evt do
        db = Sequel.connect(adapter: "postgres", host: "127.0.0.1", port: @server.port, user: "evt", database: "postgres",
                            max_connections: 8, pool_timeout: 10)
        8.times do |i|
          Fiber.schedule { results << db.fetch("SELECT ?::int AS n, pg_sleep(0.3)", i).first[:n] }
        end
        Fiber.schedule do
          sleep 0.05 until results.size == 8
          db.disconnect
        end
      end
    end
    assert_equal (0...8).to_a, results.sort
    assert_operator took, :<, 2.4, "eight 0.3 s queries took #{took} s: they did not overlap"
  end
end
