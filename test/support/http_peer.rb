# frozen_string_literal: true

require "socket"

module EvtTest
  # An HTTP/1.1 server on plain Ruby threads (no scheduler), for clients under test in Evt.run: it
  # runs whatever the loop under test does. Answers every request with its path after +delay+
  # seconds, keeps connections alive unless told otherwise, and counts requests and connections.
  #
  #   server = HttpPeer.new(delay: 1)
  #   server.port; server.requests; server.close
  class HttpPeer
    attr_reader :port

    # @param delay [Numeric] seconds before each answer
    # @param close [Boolean] answer `Connection: close` and close after each response
    # @param body [String, nil] the body of every answer (default: the request's path)
    def initialize(delay: 0, close: false, body: nil)
      @delay = delay
      @close = close
      @body = body
      @server = TCPServer.new("127.0.0.1", 0)
      @port = @server.local_address.ip_port
      @lock = Mutex.new
      @requests = 0
      @connections = 0
      @threads = []
      @acceptor = Thread.new { accept_loop }
    end

    def requests = @lock.synchronize { @requests }
    def connections = @lock.synchronize { @connections }

    def close
      @acceptor.kill.join
      @lock.synchronize { @threads.dup }.each { |thread| thread.kill.join }
      @server.close
    end

    private

    def accept_loop
      loop do
        client = @server.accept
        @lock.synchronize do
          @connections += 1
          @threads << Thread.new { serve(client) }
        end
      end
    end

    def serve(client)
      while (request = client.gets)
        length = 0
        while (line = client.gets) && line != "\r\n"
          length = Integer(line.split(":", 2).last) if line.downcase.start_with?("content-length:")
        end
        client.read(length) if length.positive?
        @lock.synchronize { @requests += 1 }
        sleep @delay if @delay.positive?
        body = @body || request.split[1]
        client.write("HTTP/1.1 200 OK\r\nContent-Length: #{body.bytesize}\r\n" \
                     "Connection: #{@close ? "close" : "keep-alive"}\r\n\r\n#{body}")
        break if @close
      end
    rescue IOError, SystemCallError
      nil # the client went away
    ensure
      client.close
    end
  end
end
