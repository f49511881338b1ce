# frozen_string_literal: true

# http-cpu's server: WORKERS evt worker processes (Evt::Workers) on one listening socket, each
# request costing about 0.5 ms of Ruby work before the fixed response.
#
#   ruby bench/http_cpu_server.rb WORKERS
#
# Prints "listening on PORT" once it accepts connections on 127.0.0.1.
require "socket"
require "evt"
require_relative "http_handler"

# About half a millisecond of Ruby on this machine (a loop the VM cannot skip).
def work
  total = 0
  9_000.times { |i| total += i * i % 7 }
  total
end

workers = Integer(ARGV.fetch(0) { abort "usage: http_cpu_server.rb WORKERS" })
server = Bench::HTTPHandler.listen
Evt::Workers.new(count: workers, listeners: [server]).run do |worker|
  until worker.stopping?
    client = server.accept
    Fiber.schedule { Bench::HTTPHandler.serve(client) { work } }
  end
rescue IOError
  nil
end
