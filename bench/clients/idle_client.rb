# frozen_string_literal: true

# idle-connections, the client side: opens COUNT connections to PORT, prints "connected", and keeps
# them open until its standard input closes.
#
#   ruby bench/clients/idle_client.rb PORT COUNT
require "socket"

port = Integer(ARGV.fetch(0))
count = Integer(ARGV.fetch(1))
sockets = Array.new(count) { TCPSocket.new("127.0.0.1", port) }
$stdout.puts "connected #{sockets.size}"
$stdout.flush
$stdin.read
