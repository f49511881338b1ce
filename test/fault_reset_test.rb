# frozen_string_literal: true

require "test_helper"

# Fault: the peer goes away abruptly while fibers read or write. A TCP peer that closes with
# SO_LINGER 0 sends a reset (RST); a pipe or UNIX socket reader that closes leaves writers with
# EPIPE. Each waiting fiber must get the error Ruby raises without a scheduler (Errno::ECONNRESET,
# Errno::EPIPE), also when a large write is in flight (in the ring, on io_uring); the loop goes on,
# and no descriptor is left behind.
class FaultResetTest < Minitest::Test
  def evt(timeout: 10, &block)
    super
  end

  # A connected loopback TCP pair: [client, accepted]. Small buffers keep a large write in flight.
  def tcp_pair(small_buffers: false)
    server = TCPServer.new("127.0.0.1", 0)
    client = Socket.tcp("127.0.0.1", server.local_address.ip_port)
    accepted = server.accept
    if small_buffers
      client.setsockopt(:SOCKET, :SNDBUF, 65_536)
      accepted.setsockopt(:SOCKET, :RCVBUF, 65_536)
    end
    [client, accepted]
  ensure
    server&.close
  end

  # The kqueue backend on Linux runs on libkqueue, which reads a socket's pending error with
  # getsockopt(SO_ERROR) to put it in the event, and so clears it: the call that comes next finds the
  # connection gone, as if another caller had been told of the reset (a reader meets end of file, a
  # writer EPIPE). A real kqueue leaves the error for that call. The README says so (Backends).
  def reset_taken_by_libkqueue?
    EvtTest::BACKEND == :kqueue && RUBY_PLATFORM.include?("linux")
  end

  # Closes +socket+ with a reset instead of an orderly shutdown.
  def reset(socket)
    socket.setsockopt(Socket::Option.linger(true, 0))
    socket.close
  end

  READERS = {
    "read" => ->(s) { s.read(10) },
    "readpartial" => ->(s) { s.readpartial(10) },
    "gets" => ->(s) { s.gets },
    "recv" => ->(s) { s.recv(10) },
    "sysread" => ->(s) { s.sysread(10) },
    "wait_readable + read_nonblock" => ->(s) { s.wait_readable && s.read_nonblock(10) }
  }.freeze

  # Each way of reading, waiting when the reset arrives: the same error as without a scheduler.
  def test_a_reader_waiting_when_the_peer_resets
    expected = READERS.transform_values do |read|
      client, peer = tcp_pair
      reset(peer)
      if reset_taken_by_libkqueue?
        IO.select([client])
        client.getsockopt(:SOCKET, :ERROR)
        next begin
          read.call(client)
        rescue SystemCallError, IOError => e
          e.class
        end
      end
      error_without_scheduler { read.call(client) }.class
    ensure
      client&.close
    end
    assert_equal [Errno::ECONNRESET], expected.values.uniq unless reset_taken_by_libkqueue?

    before = descriptor_table
    outcomes = {}
    evt do
      pairs = READERS.map do |name, read|
        client, peer = tcp_pair
        # Runs until it waits: the reset below reaches a fiber already waiting.
        Fiber.schedule do
          outcomes[name] = read.call(client)
        rescue SystemCallError, IOError => e
          outcomes[name] = e.class
        ensure
          client.close
        end
        peer
      end
      pairs.each { |peer| reset(peer) }
    end
    assert_equal expected, outcomes
    assert_no_descriptor_leaked before
  end

  # Waits until the bytes sent to +socket+ have been taken by its reader (none left in the kernel).
  def wait_until_taken(socket)
    sleep 0.001 until socket.recv_nonblock(1, Socket::MSG_PEEK, exception: false) == :wait_readable
  end

  # Part of a message has arrived when the reset comes: read(n), waiting for the rest, raises as
  # without a scheduler (the partial bytes go with it).
  def test_a_reader_midway_through_a_message_when_the_peer_resets
    expected = begin
      client, peer = tcp_pair
      thread = Thread.new do
        peer.write("partial")
        wait_until_taken(client)
        reset(peer)
      end
      error_without_scheduler { client.read(100) }.class
    ensure
      thread&.join
      client&.close
    end
    assert_equal Errno::ECONNRESET, expected
    expected = "partial" if reset_taken_by_libkqueue? # read(100) meets end of file after it

    outcome = nil
    evt do
      client, peer = tcp_pair
      Fiber.schedule do
        outcome = client.read(100)
      rescue SystemCallError => e
        outcome = e.class
      end
      peer.write("partial")
      wait_until_taken(client)
      reset(peer)
      sleep 0.001 while outcome.nil?
      client.close
    end
    assert_equal expected, outcome
  end

  # A write far larger than the socket buffers is in flight (partly sent, the rest waiting for
  # room, in the ring on io_uring) when the peer, having read some of it, resets.
  def test_a_large_write_in_flight_when_the_peer_resets
    payload = "z" * 4_000_000
    expected = begin
      client, peer = tcp_pair(small_buffers: true)
      thread = Thread.new do
        peer.read(65_536)
        reset(peer)
      end
      first = error_without_scheduler { client.write(payload) }.class
      [first, error_without_scheduler { client.write("more") }.class]
    ensure
      thread&.join
      client&.close
    end
    assert_equal [Errno::ECONNRESET, Errno::EPIPE], expected
    expected = [Errno::EPIPE, Errno::EPIPE] if reset_taken_by_libkqueue?

    before = descriptor_table
    outcomes = []
    other = nil
    evt do
      client, peer = tcp_pair(small_buffers: true)
      writer = Fiber.schedule do
        client.write(payload)
        outcomes << :written
      rescue SystemCallError => e
        outcomes << e.class
        begin
          client.write("more")
        rescue SystemCallError => e
          outcomes << e.class
        end
      ensure
        client.close
      end
      # Here the writer waits with most of the payload unsent.
      assert_equal 65_536, peer.read(65_536).bytesize
      reset(peer)
      sleep 0.001 while writer.alive?
      # The loop goes on: a new connection carries data both ways.
      a, b = tcp_pair
      Fiber.schedule { b.write(b.read(5).reverse) }
      a.write("hello")
      other = a.read(5)
      [a, b].each(&:close)
    end
    assert_equal expected, outcomes
    assert_equal "olleh", other
    assert_no_descriptor_leaked before
  end

  # A reader and a writer wait on the same socket when the reset arrives. The kernel reports the
  # reset once: whichever call comes first gets ECONNRESET, the other sees the connection gone
  # (a writer EPIPE, a reader end of file), as with two threads. Neither may be left waiting.
  def test_a_reader_and_a_writer_on_one_socket_when_the_peer_resets
    read_outcome = write_outcome = :waiting
    evt do
      client, peer = tcp_pair(small_buffers: true)
      Fiber.schedule do
        read_outcome = client.read(10)
      rescue SystemCallError => e
        read_outcome = e.class
      end
      Fiber.schedule do
        client.write("w" * 4_000_000)
        write_outcome = :written
      rescue SystemCallError => e
        write_outcome = e.class
      end
      reset(peer)
      sleep 0.001 while read_outcome == :waiting || write_outcome == :waiting
      client.close
    end
    assert_includes [Errno::ECONNRESET, nil], read_outcome
    assert_includes [Errno::ECONNRESET, Errno::EPIPE], write_outcome
    unless reset_taken_by_libkqueue?
      assert_includes [read_outcome, write_outcome], Errno::ECONNRESET, "the reset was reported to neither"
    end
  end

  # Many connections reset at once, half of them with a reader waiting, half with a writer: each
  # fiber gets its error, the others are not disturbed, and every descriptor is released.
  def test_many_connections_reset_at_once
    count = 60
    before = descriptor_table
    outcomes = Array.new(count, :waiting)
    survivors = []
    evt do
      peers = Array.new(count) do |i|
        client, peer = tcp_pair(small_buffers: true)
        Fiber.schedule do
          outcomes[i] = i.even? ? client.read(10) : client.write("x" * 1_000_000)
        rescue SystemCallError => e
          outcomes[i] = e.class
        ensure
          client.close
        end
        peer
      end
      # Connections that stay up, waiting through the storm of resets.
      kept = Array.new(5) { tcp_pair }
      kept.each_with_index { |(a, _), i| Fiber.schedule { survivors[i] = a.read(6) } }
      peers.each { |peer| reset(peer) }
      sleep 0.001 until outcomes.all? { |outcome| outcome != :waiting }
      kept.each_with_index { |(_, b), i| b.write(format("alive%d", i)) }
      sleep 0.001 until survivors.compact.size == kept.size
      kept.flatten.each(&:close)
    end
    if reset_taken_by_libkqueue?
      outcomes.each_with_index do |outcome, i|
        assert_includes [Errno::ECONNRESET, i.even? ? nil : Errno::EPIPE], outcome, "connection #{i}"
      end
    else
      assert_equal [Errno::ECONNRESET] * count, outcomes
    end
    assert_equal Array.new(5) { |i| format("alive%d", i) }, survivors
    assert_no_descriptor_leaked before
  end

  # The reader of a pipe or of a UNIX socket goes away in the middle of a large write: EPIPE, as
  # without a scheduler.
  def test_a_large_write_in_flight_when_the_reader_of_a_pipe_or_unix_socket_closes
    makers = {"pipe" => -> { IO.pipe.reverse }, "unix socket" => -> { UNIXSocket.pair }}
    payload = "p" * 4_000_000
    expected = makers.transform_values do |make|
      writer, reader = make.call
      thread = Thread.new do
        reader.read(1000)
        reader.close
      end
      error_without_scheduler { writer.write(payload) }.class
    ensure
      thread&.join
      writer&.close
    end
    assert_equal [Errno::EPIPE], expected.values.uniq

    before = descriptor_table
    outcomes = {}
    evt do
      makers.each do |name, make|
        writer, reader = make.call
        fiber = Fiber.schedule do
          writer.write(payload)
          outcomes[name] = :written
        rescue SystemCallError => e
          outcomes[name] = e.class
        ensure
          writer.close
        end
        assert_equal 1000, reader.read(1000).bytesize
        reader.close
        sleep 0.001 while fiber.alive?
      end
    end
    assert_equal expected, outcomes
    assert_no_descriptor_leaked before
  end
end
