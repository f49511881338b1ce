# frozen_string_literal: true

# The Ruby work of bench/servers/http_handler.rb per keep-alive request, with no network and no scheduler:
# the request's lines read with gets from a socket's buffered data, the header check, the response
# written to a StringIO (no system call counted). CPU µs per request: the part of http-keepalive's
# figure that the C server, which parses nothing, does not pay.
#
#   ruby [--yjit] bench/tools/handler_floor.rb [REQUESTS]
require "socket"
require "stringio"
require_relative "../servers/http_handler"
REQ = "GET / HTTP/1.1\r\nHost: 127.0.0.1:40000\r\n\r\n" # wrk's request
N = Integer(ARGV[0] || 2_000_000)
BATCH = 200
r, w = UNIXSocket.pair
sink = StringIO.new
resp = Bench::HTTPHandler::RESPONSE
t0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
(N / BATCH).times do
  w.write(REQ * BATCH)
  BATCH.times do
    close = false
    while (line = r.gets)
      break if line == "\r\n"
      close = true if line.match?(/\Aconnection:\s*close/i)
    end
    sink.write(close ? "x" : resp)
  end
  sink.rewind
end
t1 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
puts format("%s%s: %.3f CPU us/request (handler's Ruby work, no network)", RUBY_VERSION, defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? " YJIT" : "", (t1 - t0) * 1e6 / N)
