# frozen_string_literal: true

require "test_helper"

# IO#write with several strings on a socket (and #puts, which writes a line and its newline): Ruby
# without a scheduler sends them with one writev(2); under evt they go as one send too, not as one
# segment per string (which Nagle's algorithm holds back for ~40 ms against a peer delaying its ACKs).
# A single string goes out with one send as well, without a trip through the scheduler's io_write.
class SocketWriteTest < Minitest::Test
  # Counts the io_write calls Ruby makes to the scheduler.
  class CountingScheduler < Evt::Scheduler
    attr_reader :io_writes

    def io_write(...)
      @io_writes = (@io_writes || 0) + 1
      super
    end
  end

  def with_counting_scheduler
    scheduler = CountingScheduler.new
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule { yield }
    ensure
      Fiber.set_scheduler(nil)
    end
    scheduler.io_writes || 0
  end
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

  # Evt::SelectScheduler (the pure-Ruby loop, a sibling of Evt::Scheduler) is evt's too.
  def test_write_of_two_strings_is_one_segment_on_the_pure_ruby_loop
    writer, peer = tcp_pair
    segments = nil
    scheduler = Evt::SelectScheduler.new
    Timeout.timeout(30) do
      Fiber.set_scheduler(scheduler)
      Fiber.schedule do
        before = data_segments_sent(writer)
        writer.write("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "hello")
        peer.read(43)
        segments = data_segments_sent(writer) - before
      end
    ensure
      Fiber.set_scheduler(nil)
    end
    assert_equal 1, segments, "write(head, body) under Evt::SelectScheduler left as #{segments} segments"
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

  # The response-sized write of one string that the socket takes at once is one send(2) from the
  # string: no io_write (on io_uring that suspended the fiber until the ring's completion, holding
  # the IO's write lock). One too big for the socket goes on through io_write for the rest.
  def test_one_string_the_socket_takes_goes_out_without_io_write
    skip "the pure-Ruby loop sends one string through io_write" unless Evt.extension?
    writer, peer = tcp_pair
    received = nil
    writes = with_counting_scheduler do
      assert_equal 11, writer.write("hello world")
      received = peer.read(11)
    end
    assert_equal "hello world", received
    assert_equal 0, writes, "a write the socket took at once went through io_write"
    big = "x" * 4_000_000
    # Buffers fixed small: the kernel's autotuning can grow a loopback socket's to take 4 MB at once.
    writer.setsockopt(Socket::SOL_SOCKET, Socket::SO_SNDBUF, 65_536)
    peer.setsockopt(Socket::SOL_SOCKET, Socket::SO_RCVBUF, 65_536)
    writes = with_counting_scheduler do
      Fiber.schedule { received = peer.read(big.bytesize) }
      assert_equal big.bytesize, writer.write(big)
    end
    assert_equal big, received
    assert_operator writes, :>=, 1, "the rest of a write bigger than the socket buffer did not wait through io_write"
  ensure
    writer&.close
    peer&.close
  end

  # Fibers writing big single strings on one socket: each arrives in one piece, as with a thread.
  def test_concurrent_single_string_writes_do_not_interleave
    writer, peer = tcp_pair
    messages = %w[x y z].map { |c| "#{c * 1_500_000}!" }
    received = nil
    evt do
      Fiber.schedule { received = peer.read(messages.sum(&:bytesize)) }
      messages.each { |message| Fiber.schedule { writer.write(message) } }
    end
    assert_equal messages.sort, received.scan(/(?:x+!|y+!|z+!)/).sort
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

  # A write of several strings and of one, each raising what Ruby raises without a scheduler.
  def assert_writes_raise_as_ruby_does(writer)
    [%w[a b], %w[ab]].each do |strings|
      expected = error_without_scheduler { writer.write(*strings) }
      raised = nil
      evt do
        raised = assert_raises(expected.class) { writer.write(*strings) }
      end
      assert_equal expected.message, raised.message
    end
  end

  def test_errors_are_the_ones_ruby_raises
    writer, peer = tcp_pair
    writer.close_write
    assert_writes_raise_as_ruby_does(writer)
    writer.close
    assert_writes_raise_as_ruby_does(writer)
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
    writer.close
    writer, peer = tcp_pair
    peer.close
    evt do
      raised = assert_raises(Errno::EPIPE, Errno::ECONNRESET) do
        20.times { writer.write("a" * 100_000) }
      end
    end
    assert_kind_of SystemCallError, raised
  ensure
    writer&.close
  end
end
