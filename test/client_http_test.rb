# frozen_string_literal: true

require "test_helper"
require "net/http"
require "timeout"
require_relative "support/http_peer"

# HTTP clients under evt against a real server (EvtTest::HttpPeer, on plain threads): Net::HTTP,
# and how Timeout and multi-string writes behave around them.
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
end
