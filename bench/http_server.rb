# frozen_string_literal: true

# The HTTP server every Ruby subject of bin/bench runs: read the request lines with gets until the
# blank line, write a fixed response, keep the connection while the client does.
#
#   ruby bench/http_server.rb SUBJECT
#
# Prints "listening on PORT" once it accepts connections on 127.0.0.1 (a port the kernel chose).
require "socket"
require_relative "subject"

RESPONSE = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nHello World\n"
CLOSE_RESPONSE = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n" \
                 "Connection: close\r\n\r\nHello World\n"

def serve(client)
  loop do
    close = false
    while (line = client.gets)
      break if line == "\r\n"

      close = true if line.match?(/\Aconnection:\s*close/i)
    end
    break unless line

    client.write(close ? CLOSE_RESPONSE : RESPONSE)
    break if close
  end
rescue Errno::ECONNRESET, Errno::EPIPE
  nil
ensure
  client.close
end

subject = ARGV.fetch(0) { abort "usage: http_server.rb SUBJECT (evt-<backend>, async-<selector>, blocking, threads)" }
server = TCPServer.new("127.0.0.1", 0)
server.listen(1024)
$stdout.puts "listening on #{server.local_address.ip_port}"
$stdout.flush

case subject
when "blocking"
  loop { serve(server.accept) }
when "threads"
  loop { Thread.new(server.accept) { |client| serve(client) } }
else
  Bench::Subject.run(subject) do
    loop do
      client = server.accept
      Fiber.schedule { serve(client) }
    end
  end
end
