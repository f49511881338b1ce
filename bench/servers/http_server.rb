# frozen_string_literal: true

# The HTTP server every Ruby subject of bin/bench runs, with the shared handler (http_handler.rb).
#
#   ruby bench/servers/http_server.rb SUBJECT
#
# Prints "listening on PORT" once it accepts connections on 127.0.0.1 (a port the kernel chose).
require "socket"
require_relative "../subject"
require_relative "http_handler"

subject = ARGV.fetch(0) { abort "usage: http_server.rb SUBJECT (evt-<backend>, async-<selector>, blocking, fibers, threads)" }
server = Bench::HTTPHandler.listen

case subject
when "blocking"
  loop { Bench::HTTPHandler.serve(server.accept) }
when "fibers"
  # Ruby's floor for a fiber per connection: a plain Fiber each, no scheduler, one at a time.
  loop do
    client = server.accept
    Fiber.new { Bench::HTTPHandler.serve(client) }.resume
  end
when "threads"
  loop { Thread.new(server.accept) { |client| Bench::HTTPHandler.serve(client) } }
else
  Bench::Subject.run(subject) do
    loop do
      client = server.accept
      Fiber.schedule { Bench::HTTPHandler.serve(client) }
    end
  end
end
