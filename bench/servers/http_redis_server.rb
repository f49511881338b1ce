# frozen_string_literal: true

# http-redis's server: the original evt's second benchmark. Each request's handler reads one key
# from a real redis-server through a redis-client connection pool and answers with its value.
#
#   ruby -rbundler/setup bench/servers/http_redis_server.rb SUBJECT REDIS_PORT POOL
#
# SUBJECT as for http_server.rb (a fiber per connection; `threads`: a thread per connection).
# Prints "listening on PORT" once it accepts connections on 127.0.0.1. A request whose GET fails
# ends its connection (wrk counts it as an error) and the error goes to stderr.
require "socket"
require "redis-client"
require_relative "../subject"
require_relative "http_handler"

KEY = "evt:bench:greeting"

subject, redis_port, pool_size = ARGV
abort "usage: http_redis_server.rb SUBJECT REDIS_PORT POOL" unless pool_size
pool = RedisClient.config(host: "127.0.0.1", port: Integer(redis_port)).new_pool(size: Integer(pool_size), timeout: 5)
handle = lambda do |client|
  Bench::HTTPHandler.serve(client) { pool.call("GET", KEY) or raise "#{KEY} is not set" }
rescue StandardError => e
  warn "http-redis: #{e.class}: #{e.message}"
end

server = Bench::HTTPHandler.listen

case subject
when "threads"
  loop { Thread.new(server.accept, &handle) }
else
  Bench::Subject.run(subject) do
    loop do
      client = server.accept
      Fiber.schedule { handle.call(client) }
    end
  end
end
