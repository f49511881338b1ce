# frozen_string_literal: true

# idle-connections, the server side: accepts COUNT connections and leaves a fiber (or a thread, for
# `threads`) waiting to read on each; once all wait, prints {"rss_mb"} as JSON and exits.
#
#   ruby bench/servers/idle_server.rb SUBJECT COUNT     (prints "listening on PORT" first)
require "json"
require "socket"
require_relative "../subject"

subject = ARGV.fetch(0)
count = Integer(ARGV.fetch(1))
server = TCPServer.new("127.0.0.1", 0)
server.listen(4096)
$stdout.puts "listening on #{server.local_address.ip_port}"
$stdout.flush

waiting = 0
report = lambda do
  GC.start # what stays, not garbage not yet collected
  $stdout.puts JSON.generate(rss_mb: Bench::Subject.rss_mb.round(1), connections: waiting)
  $stdout.flush
  exit!(0) # the connections are the client's to close
end

if subject == "threads"
  mutex = Mutex.new
  all = ConditionVariable.new
  count.times do
    Thread.new(server.accept) do |client|
      mutex.synchronize do
        waiting += 1
        all.signal if waiting == count
      end
      client.read(1)
    end
  end
  mutex.synchronize { all.wait(mutex) while waiting < count }
  sleep 0.2 # every thread is in its read by now
  report.call
else
  Bench::Subject.run(subject) do
    count.times do
      client = server.accept
      Fiber.schedule do
        waiting += 1
        client.read(1)
      end
    end
    sleep 0.2
    report.call
  end
end
