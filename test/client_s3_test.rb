# frozen_string_literal: true

require "test_helper"
require_relative "support/servers"

begin
  require "aws-sdk-s3"
rescue LoadError => e
  AWS_SDK_MISSING = e.message
end

# The AWS SDK for Ruby (aws-sdk-s3, over Net::HTTP) under evt against s3rver, a local S3-like
# server: objects put and got by concurrent fibers come back whole and their requests overlap, a
# listing sees them all, a missing key raises the SDK's own error, and a request cut by
# Timeout.timeout leaves the fiber free and the client working.
class ClientS3Test < Minitest::Test
  BUCKET = "evt-test"
  # Sizes from one byte to past a socket's buffer, so that bodies go out and come in over many
  # waits.
  SIZES = [1, 1_000, 64 * 1024, 1_000_000, 3_000_000, 17, 300_000, 2_000_000].freeze

  # Wraps every send of the client: the most requests under way at once.
  class InFlight
    attr_reader :most

    def initialize
      @now = 0
      @most = 0
    end

    def around
      @now += 1
      @most = @now if @now > @most
      yield
    ensure
      @now -= 1
    end
  end

  def setup
    skip "aws-sdk-s3 is not installed (bundle install): #{AWS_SDK_MISSING}" if defined?(AWS_SDK_MISSING)
    @server = Servers.s3(self)
  end

  # s3rver takes its fixed credentials; retries off, so that a failure shows as it is.
  def client(in_flight = nil, port: @server.port, **options)
    client = Aws::S3::Client.new(endpoint: "http://127.0.0.1:#{port}", region: "us-east-1",
                                 access_key_id: "S3RVER", secret_access_key: "S3RVER", force_path_style: true,
                                 retry_limit: 0, **options)
    # Closest to the send step: around the request on the wire, its response read whole.
    client.handle(step: :sign, priority: 0) { |context| in_flight.around { @handler.call(context) } } if in_flight
    client
  end

  def ensure_bucket(s3)
    s3.create_bucket(bucket: BUCKET)
  rescue Aws::S3::Errors::BucketAlreadyOwnedByYou, Aws::S3::Errors::BucketAlreadyExists
    nil
  end

  def test_concurrent_puts_and_gets_come_back_whole_and_overlap
    bodies = SIZES.each_with_index.to_h { |size, i| ["object-#{i}", Random.new(i).bytes(size)] }
    got = {}
    puts_in_flight = InFlight.new
    gets_in_flight = InFlight.new
    evt do
      ensure_bucket(client)
      s3 = client(puts_in_flight)
      bodies.each { |key, body| Fiber.schedule { s3.put_object(bucket: BUCKET, key: key, body: body) } }
    end
    evt do # once every put is over
      s3 = client(gets_in_flight)
      bodies.each_key { |key| Fiber.schedule { got[key] = s3.get_object(bucket: BUCKET, key: key).body.read.b } }
    end
    assert_equal bodies.keys.sort, got.keys.sort
    bodies.each { |key, body| assert_equal body, got[key], "#{key} (#{body.bytesize} bytes) did not come back whole" }
    assert_operator puts_in_flight.most, :>=, 2, "the puts never overlapped: the fibers did not wait in the scheduler"
    assert_operator gets_in_flight.most, :>=, 2, "the gets never overlapped: the fibers did not wait in the scheduler"
  end

  def test_a_listing_sees_every_object_put_by_fibers
    keys = Array.new(30) { |i| format("listed/%02d", i) }
    listed = nil
    evt do
      s3 = client
      ensure_bucket(s3)
      keys.each { |key| Fiber.schedule { s3.put_object(bucket: BUCKET, key: key, body: key) } }
    end
    evt { listed = client.list_objects_v2(bucket: BUCKET, prefix: "listed/").contents.map(&:key) }
    assert_equal keys, listed
  end

  def test_a_missing_key_raises_the_sdk_error_in_its_fiber
    error = nil
    other = nil
    evt do
      s3 = client
      ensure_bucket(s3)
      Fiber.schedule do
        s3.get_object(bucket: BUCKET, key: "no such key")
      rescue Aws::S3::Errors::ServiceError => e
        error = e
      end
      Fiber.schedule { other = s3.put_object(bucket: BUCKET, key: "present", body: "x").etag }
    end
    assert_kind_of Aws::S3::Errors::NoSuchKey, error
    refute_nil other
  end

  # A server that takes the connection and never answers stands in for a stuck S3: the fiber's
  # Timeout.timeout cuts the request, and the other fibers' requests to s3rver go on meanwhile.
  def test_a_request_cut_by_a_timeout_frees_the_fiber
    silent = TCPServer.new("127.0.0.1", 0)
    error = nil
    other = nil
    took = elapsed do
      evt do
        stuck = client(port: silent.local_address.ip_port, http_read_timeout: 30)
        Fiber.schedule do
          Timeout.timeout(0.3) { stuck.get_object(bucket: BUCKET, key: "never") }
        rescue Timeout::Error => e
          error = e
        end
        Fiber.schedule do
          s3 = client
          ensure_bucket(s3)
          other = s3.put_object(bucket: BUCKET, key: "beside", body: "y").etag
        end
      end
    end
    assert_kind_of Timeout::Error, error
    refute_nil other
    assert_operator took, :<, 10, "the cut request held the loop for #{took} s"
  ensure
    silent&.close
  end
end
