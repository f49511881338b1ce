# frozen_string_literal: true

require "test_helper"

# IO#write with several strings on a socket (and #puts, which writes a line and its newline): Ruby
# without a scheduler sends them with one writev(2); under evt they go as one send too, not as one
# segment per string (which Nagle's algorithm holds back for ~40 ms against a peer delaying its ACKs).
class SocketWriteTest < Minitest::Test
  # tcp_info's tcpi_data_segs_out (Linux 4.6): the data segments the socket has sent.
  DATA_SEGS_OUT = 156

  def data_segments_sent(socket)
    info = socket.getsockopt(Socket::IPPROTO_TCP, Socket::TCP_INFO).data
    skip "tcp_info has no tcpi_data_segs_out on this kernel" if info.bytesize < DATA_SEGS_OUT + 4
    info.unpack1("L", offset: DATA_SEGS_OUT)
  end

  # A connected pair: [the accepted socket (the writer under test), the peer].
  def tcp_pair
    server = TCPServer.new("127.0.0.1", 0)
    peer = TCPSocket.new("127.0.0.1", server.local_address.ip_port)
    [server.accept, peer]
  ensure
    server&.close
  end

  def test_write_of_two_strings_is_one_segment
    writer, peer = tcp_pair
    segments = nil
    written = nil
    evt do
      before = data_segments_sent(writer)
      written = writer.write("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "hello")
      assert_equal "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", peer.read(43)
      segments = data_segments_sent(writer) - before
    end
    assert_equal 43, written
    assert_equal 1, segments, "write(head, body) left as #{segments} segments"
  ensure
    writer&.close
    peer&.close
  end

  def test_puts_is_one_segment
    writer, peer = tcp_pair
    segments = nil
    evt do
      before = data_segments_sent(writer)
      writer.puts("PING")
      assert_equal "PING\n", peer.read(5)
      segments = data_segments_sent(writer) - before
    end
    assert_equal 1, segments, "puts left as #{segments} segments"
  ensure
    writer&.close
    peer&.close
  end

  # More than the socket takes at once: what the first send left goes on through Ruby's write,
  # which waits for the reader; the bytes arrive whole and in order.
  def test_a_write_bigger_than_the_socket_buffer_arrives_whole
    writer, peer = tcp_pair
    pieces = [("a" * 3_000_000).b, "-".b, ("b" * 2_000_000).b, "\u00e9t\u00e9"] # the last one UTF-8
    received = nil
    written = nil
    evt do
      reader = Fiber.schedule { received = peer.read(5_000_006) }
      written = writer.write(*pieces)
      assert reader
    end
    assert_equal 5_000_006, written
    assert_equal pieces.map(&:b).join, received
  ensure
    writer&.close
    peer&.close
  end

  # Two fibers writing big messages of several strings on one socket: each arrives in one piece,
  # as Ruby's write lock keeps them apart without a scheduler.
  def test_concurrent_writes_do_not_interleave
    writer, peer = tcp_pair
    messages = %w[x y z].map { |c| [c * 1_500_000, "#{c}!"] }
    received = nil
    evt do
      Fiber.schedule { received = peer.read(messages.sum { |m| m.sum(&:bytesize) }) }
      messages.each { |message| Fiber.schedule { writer.write(*message) } }
    end
    chunks = received.scan(/(\w)\1*!/).flatten
    assert_equal 3, chunks.size
    assert_equal messages.map { |m| m.join }.sort, received.scan(/(?:x+x!|y+y!|z+z!)/).sort
  ensure
    writer&.close
    peer&.close
  end

  def test_objects_other_than_strings_are_written_as_ruby_writes_them
    writer, peer = tcp_pair
    written = nil
    evt do
      written = writer.write(12, :ab, nil, 3.5)
      assert_equal "12ab3.5", peer.read(7)
    end
    assert_equal 7, written
  ensure
    writer&.close
    peer&.close
  end

  def test_empty_strings_write_nothing
    writer, peer = tcp_pair
    evt do
      assert_equal 0, writer.write("", "")
      writer.write("", "x")
      assert_equal "x", peer.read(1)
    end
  ensure
    writer&.close
    peer&.close
  end

  def test_errors_are_the_ones_ruby_raises
    writer, peer = tcp_pair
    writer.close_write
    expected = error_without_scheduler { writer.write("a", "b") }
    raised = nil
    evt do
      raised = assert_raises(expected.class) { writer.write("a", "b") }
    end
    assert_equal expected.message, raised.message
    writer.close
    expected = error_without_scheduler { writer.write("a", "b") }
    evt do
      raised = assert_raises(expected.class) { writer.write("a", "b") }
    end
    assert_equal expected.message, raised.message
  ensure
    writer&.close
    peer&.close
  end

  def test_a_peer_gone_raises_epipe_as_without_a_scheduler
    writer, peer = tcp_pair
    peer.close
    raised = nil
    evt do
      raised = assert_raises(Errno::EPIPE, Errno::ECONNRESET) do
        20.times { writer.write("a" * 100_000, "b") } # the first may still be taken
      end
    end
    assert_kind_of SystemCallError, raised
  ensure
    writer&.close
  end
end
