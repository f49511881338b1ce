# frozen_string_literal: true

require "openssl"
require "socket"
require "tempfile"

module EvtTest
  # An HTTP/1.1 server on plain Ruby threads (no scheduler), for clients under test in Evt.run: it
  # runs whatever the loop under test does. Answers every request with its path after +delay+
  # seconds, keeps connections alive unless told otherwise, and counts requests and connections.
  #
  #   server = HttpPeer.new(delay: 1)
  #   server.port; server.requests; server.close
  #
  # With tls: true it speaks HTTPS with a self-signed certificate for "localhost" and 127.0.0.1,
  # which clients trust through #ca_file.
  class HttpPeer
    attr_reader :port

    # @param delay [Numeric] seconds before each answer
    # @param close [Boolean] answer `Connection: close` and close after each response
    # @param body [String, nil] the body of every answer (default: the request's path)
    def initialize(delay: 0, close: false, body: nil, tls: false)
      @delay = delay
      @close = close
      @body = body
      @tcp = TCPServer.new("127.0.0.1", 0)
      @port = @tcp.local_address.ip_port
      @server = tls ? tls_server(@tcp) : @tcp
      @lock = Mutex.new
      @requests = 0
      @connections = 0
      @answering = 0 # requests read and not yet answered, now
      @most_answering = 0 # and at most
      @threads = []
      @acceptor = Thread.new { accept_loop }
    end

    # A PEM file with the certificate, for clients to trust (TLS only).
    def ca_file = @ca_file&.path

    def requests = @lock.synchronize { @requests }
    def connections = @lock.synchronize { @connections }
    # The most requests the server held at once (read, not yet answered): how far clients overlapped.
    def most_answering = @lock.synchronize { @most_answering }

    def close
      @acceptor.kill.join
      @lock.synchronize { @threads.dup }.each { |thread| thread.kill.join }
      @tcp.close
      @ca_file&.close!
    end

    private

    # [key, certificate]: self-signed, for "localhost" and 127.0.0.1, valid for an hour.
    def self.self_signed
      key = OpenSSL::PKey::EC.generate("prime256v1")
      certificate = OpenSSL::X509::Certificate.new
      certificate.version = 2
      certificate.serial = 1
      certificate.subject = certificate.issuer = OpenSSL::X509::Name.parse("/CN=localhost")
      certificate.public_key = key
      certificate.not_before = Time.now - 60
      certificate.not_after = Time.now + 3600
      extensions = OpenSSL::X509::ExtensionFactory.new(certificate, certificate)
      certificate.add_extension(extensions.create_extension("subjectAltName", "DNS:localhost,IP:127.0.0.1"))
      certificate.add_extension(extensions.create_extension("basicConstraints", "CA:TRUE", true))
      certificate.sign(key, OpenSSL::Digest.new("SHA256"))
      [key, certificate]
    end

    def tls_server(tcp)
      key, certificate = HttpPeer.self_signed
      @ca_file = Tempfile.new(["evt-peer", ".pem"])
      @ca_file.write(certificate.to_pem)
      @ca_file.flush
      context = OpenSSL::SSL::SSLContext.new
      context.cert = certificate
      context.key = key
      OpenSSL::SSL::SSLServer.new(tcp, context).tap { |server| server.start_immediately = false }
    end

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
      client.accept if client.is_a?(OpenSSL::SSL::SSLSocket) # the handshake, on this connection's thread
      while (request = client.gets)
        length = 0
        while (line = client.gets) && line != "\r\n"
          length = Integer(line.split(":", 2).last) if line.downcase.start_with?("content-length:")
        end
        client.read(length) if length.positive?
        @lock.synchronize do
          @requests += 1
          @answering += 1
          @most_answering = [@most_answering, @answering].max
        end
        begin
          sleep @delay if @delay.positive?
          body = @body || request.split[1]
          client.write("HTTP/1.1 200 OK\r\nContent-Length: #{body.bytesize}\r\n" \
                       "Connection: #{@close ? "close" : "keep-alive"}\r\n\r\n#{body}")
        ensure
          @lock.synchronize { @answering -= 1 }
        end
        next unless @close

        linger(client)
        break
      end
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
      nil # the client went away
    ensure
      client.close
    end

    # Closes as servers do after `Connection: close`: the write side first, then what the client
    # sent meanwhile (pipelined requests) read and dropped until its end of file, for a second at
    # most. Closing with those unread would send a reset, which may reach the client before the
    # answer it has not read yet.
    def linger(client)
      return if client.is_a?(OpenSSL::SSL::SSLSocket)

      client.close_write
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1
      while (left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)).positive? && client.wait_readable(left)
        break unless client.read_nonblock(65_536, exception: false)
      end
    end
  end
end
