# frozen_string_literal: true

# http-cpu's server: WORKERS evt workers (Evt::Workers) on one listening socket, each request
# costing about 0.5 ms of Ruby work before the fixed response; worker processes, or with `ractors`
# Ractors of one process.
#
#   ruby bench/servers/http_cpu_server.rb WORKERS [processes|ractors]
#
# Prints "listening on PORT" once it accepts connections on 127.0.0.1.
require "socket"
require "evt"
require_relative "http_handler"

# Roughly half a millisecond of Ruby, depending on the CPU (a loop the VM cannot skip).
def work
  total = 0
  9_000.times { |i| total += i * i % 7 }
  total
end

# Each worker's block: shareable (made where self is nil), for Ractors as for processes.
SERVE = nil.instance_exec do
  proc do |worker|
    listener = worker.listeners.first
    until worker.stopping?
      client = listener.accept
      Fiber.schedule { Bench::HTTPHandler.serve(client) { work } }
    end
  rescue IOError
    nil
  end
end

workers = Integer(ARGV.fetch(0) { abort "usage: http_cpu_server.rb WORKERS [processes|ractors]" })
kind = ARGV.fetch(1, "processes")
abort "http_cpu_server.rb: processes or ractors, not #{kind}" unless %w[processes ractors].include?(kind)
server = Bench::HTTPHandler.listen
sizes = kind == "ractors" ? {ractors: workers} : {count: workers}
Evt::Workers.new(**sizes, listeners: [server]).run(SERVE)
