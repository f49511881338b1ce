# frozen_string_literal: true

require "test_helper"
require_relative "support/servers"

begin
  require "trilogy"
  require "connection_pool"
rescue LoadError => e
  TRILOGY_MISSING = e.message
end

# trilogy (GitHub's MySQL client, a C extension that waits through Ruby's IO, so through the
# scheduler) under evt against a real MariaDB: concurrent queries from a pool overlap, a
# transaction's rows come back, a query cut by Timeout.timeout leaves the fiber free and the
# server's other connections working, and a server-side error is raised as without a scheduler.
class ClientMysqlTest < Minitest::Test
  include PoolOverlap
  def setup
    skip "trilogy is not installed (bundle install): #{TRILOGY_MISSING}" if defined?(TRILOGY_MISSING)
    @server = Servers.mariadb(self)
  end

  def connect = Trilogy.new(host: "127.0.0.1", port: @server.port, username: "root")

  def test_concurrent_queries_from_a_pool_overlap
    assert_pooled_queries_overlap(method(:connect)) { |conn, i| conn.query("SELECT #{i} AS n, SLEEP(0.3) AS s").to_a.first.first }
  end

  def test_a_transaction_and_its_rows
    rows = nil
    evt do
      conn = connect
      conn.query("CREATE DATABASE IF NOT EXISTS evt_test")
      conn.change_db("evt_test")
      conn.query("CREATE TEMPORARY TABLE items (id INT PRIMARY KEY, name VARCHAR(20)) ENGINE=InnoDB")
      conn.query("BEGIN")
      500.times { |i| conn.query("INSERT INTO items VALUES (#{i}, 'item #{i}')") }
      conn.query("COMMIT")
      rows = conn.query("SELECT id, name FROM items ORDER BY id").to_a
      conn.close
    end
    assert_equal 500.times.map { |i| [i, "item #{i}"] }, rows
  end

  def test_a_query_cut_by_a_timeout_frees_the_fiber
    error = nil
    other = nil
    took = elapsed do
      evt do
        slow = connect
        Fiber.schedule do
          Timeout.timeout(0.2) { slow.query("SELECT SLEEP(5)") }
        rescue Timeout::Error => e
          error = e
        end
        Fiber.schedule { other = connect.query("SELECT 42").to_a }
      end
    end
    assert_kind_of Timeout::Error, error
    assert_equal [[42]], other
    assert_operator took, :<, 4, "the timeout of 0.2 s took #{took} s"
  end

  def test_a_server_error_is_raised_as_without_a_scheduler
    expected = begin
      connect.query("SELECT * FROM no_such_table")
    rescue Trilogy::Error => e
      e.class
    end
    raised = nil
    evt do
      connect.query("SELECT * FROM no_such_table")
    rescue Trilogy::Error => e
      raised = e
    end
    assert_equal expected, raised.class
    assert_match(/no_such_table|No database selected/, raised.message)
  end
end
