# frozen_string_literal: true

# http-cpu's server: WORKERS evt workers (Evt::Workers) on one port, each request costing about
# 0.5 ms of Ruby work before the fixed response; worker processes, or with `ractors` Ractors of one
# process.
#
#   ruby bench/servers/http_cpu_server.rb WORKERS [processes|ractors] [own|shared]
#
# On Linux each worker listens on a socket of its own at the port (SO_REUSEPORT), and the kernel
# spreads the connections over them by their addresses' hash. On one shared listener, whichever
# worker had a core when wrk's 100 connections arrived took most of them (splits from 50/50 to
# 100/0 in runs of the same server), and the p99 followed the split, not the kind of worker.
# Elsewhere (SO_REUSEPORT does not spread connections there), or with `shared`, one shared
# listener (bench/tools/worker_split.rb compares the two).
#
# Prints "listening on PORT" once every worker accepts connections on 127.0.0.1.
require "socket"
require "evt"
require_relative "http_handler"

# Roughly half a millisecond of Ruby, depending on the CPU (a loop the VM cannot skip).
def work
  total = 0
  9_000.times { |i| total += i * i % 7 }
  total
end

workers = Integer(ARGV.fetch(0) { abort "usage: http_cpu_server.rb WORKERS [processes|ractors] [own|shared]" })
kind = ARGV.fetch(1, "processes")
abort "http_cpu_server.rb: processes or ractors, not #{kind}" unless %w[processes ractors].include?(kind)
sockets = ARGV.fetch(2, "own")
abort "http_cpu_server.rb: own or shared, not #{sockets}" unless %w[own shared].include?(sockets)
SPREAD = sockets == "own" && RUBY_PLATFORM.include?("linux") && Socket.const_defined?(:SO_REUSEPORT)

# A TCP socket with SO_REUSEPORT, bound to `port` on 127.0.0.1 (0: one the kernel picks).
def reuse_port_socket(port)
  Socket.new(:INET, :STREAM).tap do |socket|
    socket.setsockopt(:SOCKET, :REUSEPORT, true)
    socket.bind(Addrinfo.tcp("127.0.0.1", port))
  end
end

if SPREAD
  # The port, held by a socket bound and not listening (so no connection waits on it), which lets
  # the workers' sockets bind to it too.
  holder = reuse_port_socket(0)
  PORT = holder.local_address.ip_port
end

# Each worker's block: shareable (made where self is nil), for Ractors as for processes.
SERVE = nil.instance_exec do
  proc do |worker|
    listener = worker.listeners.first
    unless listener
      listener = reuse_port_socket(PORT)
      listener.listen(Socket::SOMAXCONN)
      worker.on_stop { listener.close }
    end
    until worker.stopping?
      client, = listener.accept
      Fiber.schedule { Bench::HTTPHandler.serve(client) { work } }
    end
  rescue IOError
    nil
  end
end

# The sockets listening on `port` (IPv4), from the kernel's table: "0A" is TCP_LISTEN.
def listening(port)
  File.readlines("/proc/net/tcp").count { |line| line.split.then { |f| f[1]&.end_with?(format(":%04X", port)) && f[3] == "0A" } }
end

sizes = kind == "ractors" ? {ractors: workers} : {count: workers}
if SPREAD
  Thread.new do
    sleep 0.01 until listening(PORT) >= workers
    $stdout.puts "listening on #{PORT}"
    $stdout.flush
  end
  Evt::Workers.new(**sizes).run(SERVE)
else
  Evt::Workers.new(**sizes, listeners: [Bench::HTTPHandler.listen]).run(SERVE)
end
