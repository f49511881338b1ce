# frozen_string_literal: true

require "socket"

module Bench
  # The request handler every Ruby HTTP subject of bin/bench shares: read the request lines with
  # gets until the blank line, write a fixed response, keep the connection while the client does.
  module HTTPHandler
    RESPONSE = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nHello World\n"
    CLOSE_RESPONSE = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n" \
                     "Connection: close\r\n\r\nHello World\n"

    module_function

    # The server's socket on 127.0.0.1 at a port the kernel chose, with the largest backlog the
    # system allows, announced on stdout as bin/bench waits for it ("listening on PORT").
    def listen
      server = TCPServer.new("127.0.0.1", 0)
      server.listen(Socket::SOMAXCONN)
      $stdout.puts "listening on #{server.local_address.ip_port}"
      $stdout.flush
      server
    end

    # Serves +client+ until it closes or asks to; the block, if any, is each request's work, and a
    # String it returns is the response's body instead of the fixed one.
    def serve(client)
      loop do
        close = false
        while (line = client.gets)
          break if line == "\r\n"

          close = true if line.match?(/\Aconnection:\s*close/i)
        end
        break unless line

        body = yield if block_given?
        client.write(body.is_a?(String) ? response(body, close) : (close ? CLOSE_RESPONSE : RESPONSE))
        break if close
      end
    rescue Errno::ECONNRESET, Errno::EPIPE
      nil
    ensure
      client.close
    end

    # Serves +client+ the same +body+ after +head+ for every request, one write of the two strings
    # each, until the client closes (big-reads, thread-server, thread-clients).
    def serve_fixed(client, head, body)
      while (line = client.gets)
        client.write(head, body) if line == "\r\n"
      end
    rescue Errno::ECONNRESET, Errno::EPIPE
      nil
    ensure
      client.close
    end

    def response(body, close)
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: #{body.bytesize}\r\n" \
        "#{"Connection: close\r\n" if close}\r\n#{body}"
    end
  end
end
