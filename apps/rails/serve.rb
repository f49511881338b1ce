# frozen_string_literal: true

# Serves apps/rails/app.rb on 127.0.0.1, a free port, in this one process, and prints
# "listening on PORT (selector ...)" or "listening on PORT (puma, N threads)" once it accepts.
#
#   ruby apps/rails/serve.rb falcon      # Falcon: the selector is IO_EVENT_SELECTOR's
#   ruby apps/rails/serve.rb puma N      # Puma with N threads (and RAILS_POOL should be N)
#
# With BUNDLE_GEMFILE=apps/rails/Gemfile. evt's selector, as an application switches to it:
# IO_EVENT_SELECTOR=Evt and RUBYOPT="-rbundler/setup -I<evt>/lib -revt/async"; this script knows
# nothing of evt. Falcon runs as a `falcon serve` worker does (Falcon::Server and the middleware
# `falcon serve` builds, over HTTP/1.1), without the supervisor that forks it.
require "bundler/setup"

server_name = ARGV.fetch(0) { abort "usage: serve.rb falcon | puma THREADS" }
require_relative "app"

case server_name
when "falcon"
  require "async"
  require "async/http/endpoint"
  require "falcon/server"

  endpoint = Async::HTTP::Endpoint.parse("http://127.0.0.1:0").with(reuse_address: true)
  middleware = Falcon::Server.rack_middleware(Rails.application, verbose: false, cache: false)
  Sync do
    bound = endpoint.bound
    port = bound.sockets.first.to_io.local_address.ip_port
    selector = Fiber.scheduler.instance_variable_get(:@selector) # async has no reader for it
    $stdout.puts "listening on #{port} (selector #{selector.inspect})"
    $stdout.flush
    Falcon::Server.new(middleware, bound, protocol: endpoint.protocol, scheme: endpoint.scheme).run.wait
  ensure
    bound&.close
  end
when "puma"
  require "puma"
  require "puma/server"

  threads = Integer(ARGV.fetch(1, "3"))
  server = Puma::Server.new(Rails.application, nil, min_threads: threads, max_threads: threads, log_writer: Puma::LogWriter.null)
  listener = server.add_tcp_listener("127.0.0.1", 0)
  $stdout.puts "listening on #{listener.local_address.ip_port} (puma, #{threads} threads)"
  $stdout.flush
  server.run.join
else
  abort "serve.rb: no server #{server_name.inspect} (falcon, puma)"
end
