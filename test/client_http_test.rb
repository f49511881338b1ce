# frozen_string_literal: true

require "test_helper"
require "net/http"
require "timeout"
require_relative "support/http_peer"

begin
  require "excon"
  require "httpx"
rescue LoadError => e
  HTTP_GEMS_MISSING = e.message
end

# HTTP clients under evt against a real server (EvtTest::HttpPeer, on plain threads, over HTTP and
# HTTPS): Net::HTTP, excon and httpx, with concurrent requests that overlap, big bodies, timeouts
# and keep-alive reuse; and Timeout around them.
class ClientHttpTest < Minitest::Test
  def setup
    @peers = []
  end

  def teardown
    @peers.each(&:close)
  end

  def peer(**options)
    HttpPeer.new(**options).tap { |server| @peers << server }
  end

  # Without a scheduler, Timeout.timeout raises an internal exception inside the block, which
  # Net::HTTP's `rescue Timeout::Error` (its retry of an idempotent request) does not catch. Under
  # a scheduler the timeout library hands over Timeout::Error itself: were it raised inside the
  # block, Net::HTTP would send the GET again, outside the timeout, and return the body a second later.
  def test_timeout_timeout_around_net_http_raises_and_sends_once
    server = peer(delay: 1.5)
    uri = URI("http://127.0.0.1:#{server.port}/slow")
    error = nil
    took = nil
    evt do
      took = elapsed do
        error = assert_raises(Timeout::Error) { Timeout.timeout(0.2) { Net::HTTP.get(uri) } }
      end
    end
    assert_equal "execution expired", error.message
    assert_operator took, :<, 1.2, "Timeout.timeout(0.2) took #{took} s"
    assert_equal 1, server.requests, "the request was sent again after the timeout"
  end

  # The same exception a rescue inside the block sees: none of the StandardErrors.
  def test_timeout_inside_the_block_is_not_a_standard_error
    inside = nil
    outside = nil
    evt do
      outside = assert_raises(Timeout::Error) do
        Timeout.timeout(0.05) do
          sleep 1
        rescue StandardError => e
          inside = e
        end
      end
    end
    assert_nil inside, "a `rescue StandardError` in the block caught #{inside.inspect}"
    assert_equal "execution expired", outside.message
  end

  def test_timeout_with_a_class_of_its_own_is_raised_inside_the_block
    caught = nil
    evt do
      Timeout.timeout(0.05, ArgumentError, "too slow") do
        sleep 1
      rescue ArgumentError => e
        caught = e
      end
    end
    assert_equal "too slow", caught&.message
  end

  def test_nested_timeouts_each_end_at_their_own_block
    order = []
    evt do
      Timeout.timeout(5) do
        Timeout.timeout(0.05) { sleep 1 }
      rescue Timeout::Error
        order << :inner
      end
      begin
        Timeout.timeout(0.05) { Timeout.timeout(5) { sleep 1 } }
      rescue Timeout::Error
        order << :outer
      end
    end
    assert_equal %i[inner outer], order
  end

  BIG = ("0123456789abcdef" * 65_536 * 5).freeze # 5 MiB

  def gems!
    skip "excon or httpx is not installed (bundle install): #{HTTP_GEMS_MISSING}" if defined?(HTTP_GEMS_MISSING)
  end

  def url(server, path = "/")
    "#{server.ca_file ? "https" : "http"}://#{server.ca_file ? "localhost" : "127.0.0.1"}:#{server.port}#{path}"
  end

  # Twenty fibers, each its own request that the server answers after 0.2 s: together in about
  # 0.2 s, not 4.
  def assert_overlapping_requests(server)
    bodies = {}
    took = elapsed do
      evt do
        20.times { |i| Fiber.schedule { bodies[i] = yield(URI(url(server, "/#{i}"))) } }
      end
    end
    assert_equal(20.times.to_h { |i| [i, "/#{i}"] }, bodies)
    assert_operator took, :<, 2.5, "20 requests of 0.2 s took #{took} s: they did not overlap"
  end

  def net_http_get(uri, ca_file)
    Net::HTTP.start(uri.host, uri.port, use_ssl: uri.scheme == "https", ca_file: ca_file) { |http| http.get(uri.path).body }
  end

  %i[http https].each do |scheme|
    define_method(:"test_net_http_concurrent_requests_over_#{scheme}") do
      server = peer(delay: 0.2, tls: scheme == :https)
      assert_overlapping_requests(server) { |uri| net_http_get(uri, server.ca_file) }
    end

    define_method(:"test_net_http_big_body_and_keep_alive_over_#{scheme}") do
      server = peer(body: BIG, tls: scheme == :https)
      uri = URI(url(server))
      bodies = []
      evt do
        Net::HTTP.start(uri.host, uri.port, use_ssl: scheme == :https, ca_file: server.ca_file) do |http|
          5.times { bodies << http.get("/").body }
        end
      end
      assert_equal [BIG] * 5, bodies
      assert_equal 1, server.connections, "keep-alive was not reused"
    end

    define_method(:"test_excon_concurrent_requests_big_bodies_and_keep_alive_over_#{scheme}") do
      gems!
      server = peer(delay: 0.2, tls: scheme == :https)
      assert_overlapping_requests(server) { |uri| Excon.get(uri.to_s, ssl_ca_file: server.ca_file).body }
      big = peer(body: BIG, tls: scheme == :https)
      bodies = []
      evt do
        connection = Excon.new(url(big), persistent: true, ssl_ca_file: big.ca_file)
        3.times { bodies << connection.get.body }
      end
      assert_equal [BIG] * 3, bodies
      assert_equal 1, big.connections, "keep-alive was not reused"
    end

    define_method(:"test_httpx_concurrent_requests_big_bodies_and_keep_alive_over_#{scheme}") do
      gems!
      server = peer(delay: 0.2, tls: scheme == :https)
      ssl = {ca_file: server.ca_file}
      assert_overlapping_requests(server) { |uri| HTTPX.with(ssl: ssl).get(uri.to_s).raise_for_status.to_s }
      big = peer(body: BIG, tls: scheme == :https)
      bodies = []
      evt do
        session = HTTPX.with(ssl: {ca_file: big.ca_file}, persistent: true)
        3.times { bodies << session.get(url(big)).raise_for_status.to_s }
        session.close
      end
      assert_equal [BIG] * 3, bodies
      assert_equal 1, big.connections, "keep-alive was not reused"
    end
  end

  def test_read_timeouts_of_each_client
    gems!
    server = peer(delay: 3)
    errors = {}
    took = elapsed do
      evt do
        Fiber.schedule do
          Net::HTTP.start("127.0.0.1", server.port, read_timeout: 0.2, max_retries: 0) { |http| http.get("/") }
        rescue Net::ReadTimeout => e
          errors[:net_http] = e
        end
        Fiber.schedule do
          Excon.get(url(server), read_timeout: 0.2, retry_limit: 0)
        rescue Excon::Error::Timeout => e
          errors[:excon] = e
        end
        Fiber.schedule do
          errors[:httpx] = HTTPX.with(timeout: {read_timeout: 0.2, request_timeout: 0.2}).get(url(server)).error
        end
      end
    end
    assert_kind_of Net::ReadTimeout, errors[:net_http]
    assert_kind_of Excon::Error::Timeout, errors[:excon]
    assert_kind_of HTTPX::TimeoutError, errors[:httpx]
    assert_operator took, :<, 2.5, "the timeouts of 0.2 s took #{took} s"
  end
end
