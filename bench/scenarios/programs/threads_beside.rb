# frozen_string_literal: true

# thread-server and thread-clients: a scheduler's thread and plain Ruby threads in one process,
# sharing the GVL. CLIENTS clients each download a 256 KiB body ROUNDS times with Net::HTTP, over
# one keep-alive connection each, reading it in chunks (read_body); the server answers each
# request with one write of head and body.
#
#   thread-server    the clients are fibers on the subject's scheduler; the server is plain
#                    threads, one per connection
#   thread-clients   the server is fibers on the subject's scheduler (a fiber per connection); the
#                    clients are plain threads
#
# `threads` runs both sides as plain threads. Prints {"seconds", "cpu_seconds",
# "downloads_per_s"} as JSON; the CPU counts both sides.
#
#   ruby bench/scenarios/programs/threads_beside.rb SUBJECT ROLE [CLIENTS] [ROUNDS]
require "json"
require "net/http"
require "socket"
require_relative "../../servers/http_handler"
require_relative "../../subject"

subject = ARGV.fetch(0)
role = ARGV.fetch(1)
abort "threads_beside: ROLE is thread-server or thread-clients" unless %w[thread-server thread-clients].include?(role)
clients = Integer(ARGV.fetch(2, "10"))
rounds = Integer(ARGV.fetch(3, "200"))
body = ("x" * (256 * 1024)).freeze
head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: #{body.bytesize}\r\n\r\n".freeze
server = TCPServer.new("127.0.0.1", 0)
port = server.local_address.ip_port
received = Queue.new # from fibers and threads alike

serve = ->(connection) { Bench::HTTPHandler.serve_fixed(connection, head, body) }
fetch = lambda do
  Net::HTTP.start("127.0.0.1", port) do |http|
    rounds.times do
      size = 0
      http.request_get("/") { |response| response.read_body { |chunk| size += chunk.bytesize } }
      received << size
    end
  end
end
# The server's side: exactly one connection per client, each served until the client closes it.
accept_all = ->(&spawn) { Array.new(clients) { spawn.call(server.accept) } }

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
if subject == "threads"
  acceptor = Thread.new { accept_all.call { |c| Thread.new(c, &serve) }.each(&:join) }
  Array.new(clients) { Thread.new(&fetch) }.each(&:join)
  acceptor.join
elsif role == "thread-server"
  acceptor = Thread.new { accept_all.call { |c| Thread.new(c, &serve) }.each(&:join) }
  Bench::Subject.run(subject) { clients.times { Fiber.schedule { fetch.call } } }
  acceptor.join
else
  fetchers = Array.new(clients) { Thread.new(&fetch) }
  Bench::Subject.run(subject) do
    Fiber.schedule { accept_all.call { |c| Fiber.schedule { serve.call(c) } } }
  end
  fetchers.each(&:join)
end
seconds = clock.call - started
cpu_seconds = cpu.call - cpu_started
total = 0
total += received.pop until received.empty?
expected = clients * rounds * body.bytesize
abort "#{role}: received #{total} bytes, expected #{expected}" if total != expected
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: cpu_seconds.round(4),
                   downloads_per_s: (clients * rounds / seconds).round(1))
