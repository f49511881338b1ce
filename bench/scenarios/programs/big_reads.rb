# frozen_string_literal: true

# big-reads: large responses read as a client. CLIENTS fibers (threads for `threads`) each fetch
# ROUNDS bodies of 512 KiB with Net::HTTP, over one keep-alive connection each, from a server in the
# same process on the same scheduler (a fiber per connection, the body sent with one write). Prints
# {"seconds", "cpu_seconds"} as JSON; the CPU counts client and server alike.
#
#   ruby bench/scenarios/programs/big_reads.rb SUBJECT [CLIENTS] [ROUNDS]
require "json"
require "net/http"
require "socket"
require_relative "../../servers/http_handler"
require_relative "../../subject"

subject = ARGV.fetch(0)
clients = Integer(ARGV.fetch(1, "20"))
rounds = Integer(ARGV.fetch(2, "20"))
body = ("x" * (512 * 1024)).freeze
head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: #{body.bytesize}\r\n\r\n".freeze
server = TCPServer.new("127.0.0.1", 0)
port = server.local_address.ip_port
received = 0

serve = ->(connection) { Bench::HTTPHandler.serve_fixed(connection, head, body) }
fetch = lambda do
  Net::HTTP.start("127.0.0.1", port) do |http|
    rounds.times do
      size = http.get("/").body.bytesize # a fiber switch may come in between: add after
      received += size
    end
  end
end

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
if subject == "threads"
  acceptor = Thread.new { Array.new(clients) { Thread.new(server.accept, &serve) }.each(&:join) }
  Array.new(clients) { Thread.new(&fetch) }.each(&:join)
  acceptor.join
else
  Bench::Subject.run(subject) do
    # Exactly one connection per client: no close of the listening socket needed to stop.
    Fiber.schedule { clients.times { connection = server.accept; Fiber.schedule { serve.call(connection) } } }
    clients.times { Fiber.schedule { fetch.call } }
  end
end
seconds = clock.call - started
expected = clients * rounds * body.bytesize
abort "big-reads: received #{received} bytes, expected #{expected}" if received != expected
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: (cpu.call - cpu_started).round(4))
