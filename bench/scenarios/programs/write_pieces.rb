# frozen_string_literal: true

# write-pieces: a keep-alive HTTP exchange whose server answers with io.write(head, body), against
# the same server answering with io.write(head + body). Ruby without a scheduler sends either with
# one system call; a scheduler that sends the two strings as two TCP segments has the second held
# back by Nagle's algorithm until the client ACKs the first, which a client that delays its ACKs
# does some 40 ms later. The client is a forked process without a scheduler (Net::HTTP, one
# connection, ROUNDS requests after one to warm up). Prints {"split_ms", "joined_ms"}: the mean
# round trip of each, as JSON.
#
#   ruby bench/scenarios/programs/write_pieces.rb SUBJECT [ROUNDS]
require "json"
require "net/http"
require "socket"
require_relative "../../subject"

subject = ARGV.fetch(0)
rounds = Integer(ARGV.fetch(1, "50"))
head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
body = "hello"

serve = lambda do |client, split|
  while client.gets
    while (line = client.gets) && line != "\r\n"; end
    split ? client.write(head, body) : client.write(head + body)
  end
ensure
  client.close
end

# The mean round trip in ms of `rounds` keep-alive GETs from a forked client.
client = lambda do |port|
  reader, writer = IO.pipe
  pid = fork do
    reader.close
    Net::HTTP.start("127.0.0.1", port) do |http|
      http.get("/")
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      rounds.times { http.get("/") }
      writer.write(((Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000 / rounds).to_s)
    end
    exit!(0)
  end
  writer.close
  result = Float(reader.read)
  Process.wait(pid)
  result
end

figures = %i[split joined].to_h do |mode|
  server = TCPServer.new("127.0.0.1", 0)
  port = server.local_address.ip_port
  split = mode == :split
  mean = nil
  if Bench::Subject.fibers?(subject)
    Bench::Subject.run(subject) do
      Fiber.schedule { serve.call(server.accept, split) }
      # The client runs in a thread of this process's own so that the loop serves meanwhile.
      mean = Thread.new { client.call(port) }.value
    end
  else
    thread = Thread.new { serve.call(server.accept, split) }
    mean = client.call(port)
    thread.join
  end
  server.close
  [:"#{mode}_ms", mean.round(3)]
end
puts JSON.generate(figures)
