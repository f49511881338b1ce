# frozen_string_literal: true

require "test_helper"
require "net/http"
require "open3"
require "openssl"
require "timeout"
require_relative "support/http_peer"

# Real standard-library code under Evt.run, on every backend; a ticking fiber shows the others run
# meanwhile.
class StdlibTest < Minitest::Test
  def ticker
    state = {ticks: 0, running: true}
    Fiber.schedule do
      while state[:running]
        state[:ticks] += 1
        sleep 0.001
      end
    end
    state
  end

  # An HTTP/1.1 server on evt; answers with the request path. Returns the port.
  def http_server(count)
    server = TCPServer.new("127.0.0.1", 0)
    Fiber.schedule do
      count.times do
        client = server.accept
        Fiber.schedule do
          request = client.gets
          while (line = client.gets) && line != "\r\n"; end
          path = request.split[1]
          client.write("HTTP/1.1 200 OK\r\nContent-Length: #{path.bytesize}\r\nConnection: close\r\n\r\n#{path}")
          client.close
        end
      end
      server.close
    end
    server.local_address.ip_port
  end

  def test_net_http_against_a_server_in_evt_many_requests_at_once
    bodies = {}
    evt do
      port = http_server(20)
      20.times do |i|
        Fiber.schedule { bodies[i] = Net::HTTP.get(URI("http://localhost:#{port}/#{i}")) }
      end
    end
    assert_equal(20.times.to_h { |i| [i, "/#{i}"] }, bodies)
  end

  def test_socket_tcp_and_tcp_socket_to_localhost
    replies = []
    evt do
      server = TCPServer.new("127.0.0.1", 0)
      port = server.local_address.ip_port
      Fiber.schedule do
        2.times do
          client = server.accept
          client.write(client.gets.upcase)
          client.close
        end
      end
      Fiber.schedule do
        Socket.tcp("localhost", port) do |socket|
          socket.write("socket.tcp\n")
          replies << socket.read
        end
        socket = TCPSocket.new("localhost", port)
        socket.write("tcpsocket\n")
        replies << socket.read
        socket.close
      end
    end
    assert_equal ["SOCKET.TCP\n", "TCPSOCKET\n"], replies
  end

  def test_addrinfo_getaddrinfo
    addresses = nil
    evt { addresses = Addrinfo.getaddrinfo("localhost", 80, Socket::AF_INET, :STREAM).map(&:ip_address) }
    assert_equal ["127.0.0.1"], addresses
  end

  def test_open3_capture2_and_process_wait
    output = status = state = nil
    evt do
      state = ticker
      output, status = Open3.capture2("sh", "-c", "sleep 0.02; echo from the child")
      pid = Process.spawn("sh", "-c", "sleep 0.02; exit 4")
      Process.wait(pid)
      assert_equal 4, $?.exitstatus
      state[:running] = false
    end
    assert_equal "from the child\n", output
    assert status.success?
    assert_operator state[:ticks], :>, 0
  end

  def test_io_popen_write_read_and_close
    output = nil
    evt do
      IO.popen(["cat"], "r+") do |io|
        io.write("through cat")
        io.close_write
        output = io.read
      end
      assert $?.success?
    end
    assert_equal "through cat", output
  end

  def test_timeout_timeout
    state = nil
    evt do
      state = ticker
      assert_raises(Timeout::Error) { Timeout.timeout(0.02) { sleep 1 } }
      state[:running] = false
    end
    assert_operator state[:ticks], :>, 0
  end

  def test_io_select
    result = nil
    evt do
      r, w = IO.pipe
      Fiber.schedule do
        sleep 0.01
        w.write("x")
      end
      result = IO.select([r], [], [], 1)
    end
    assert_equal 1, result[0].size
  end

  def test_file_pread_and_pwrite
    Dir.mktmpdir do |dir|
      evt do
        File.open(File.join(dir, "file"), "w+") do |file|
          file.pwrite("0123456789", 0)
          assert_equal "345", file.pread(3, 3)
        end
      end
    end
  end

  def test_thread_join_and_queue_pop_with_a_timeout
    evt do
      thread = Thread.new { sleep 1 }
      assert_nil thread.join(0.01)
      thread.kill
      assert_nil Thread::Queue.new.pop(timeout: 0.01)
    end
  end

  def test_openssl_over_a_loopback_tls_server
    key, certificate = HttpPeer.self_signed
    server_context = OpenSSL::SSL::SSLContext.new
    server_context.cert = certificate
    server_context.key = key

    replies = []
    state = nil
    evt do
      state = ticker
      tcp = TCPServer.new("127.0.0.1", 0)
      port = tcp.local_address.ip_port
      server = OpenSSL::SSL::SSLServer.new(tcp, server_context)
      Fiber.schedule do
        3.times do
          client = server.accept
          Fiber.schedule do
            client.write("tls: #{client.gets}")
            client.close
          end
        end
      end
      3.times do |i|
        Fiber.schedule do
          context = OpenSSL::SSL::SSLContext.new
          context.verify_mode = OpenSSL::SSL::VERIFY_PEER
          context.cert_store = OpenSSL::X509::Store.new.tap { |store| store.add_cert(certificate) }
          socket = OpenSSL::SSL::SSLSocket.new(TCPSocket.new("127.0.0.1", port), context)
          socket.hostname = "localhost"
          socket.sync_close = true
          socket.connect
          socket.puts("hello #{i}")
          replies << socket.read
          socket.close
        end
      end
      Fiber.schedule do
        sleep 0.01 until replies.size == 3
        state[:running] = false
      end
    end
    assert_equal ["tls: hello 0\n", "tls: hello 1\n", "tls: hello 2\n"], replies.sort
    assert_operator state[:ticks], :>, 0
  end
end
