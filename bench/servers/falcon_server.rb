# frozen_string_literal: true

# The falcon scenario's server: Falcon serving one of bench/servers/rack_apps.rb's apps in this one process,
# on one thread, with no supervisor. It is what a `falcon serve` worker runs (Falcon::Server with
# the middleware `falcon serve` builds, cache and verbose off, over HTTP/1.1 without TLS) minus the
# async-container controller that forks it.
#
#   IO_EVENT_SELECTOR=EPoll|URing ruby -rbundler/setup bench/servers/falcon_server.rb APP
#   IO_EVENT_SELECTOR=Evt RUBYOPT="-I<evt>/lib -revt/async" ruby -rbundler/setup bench/servers/falcon_server.rb APP
#
# The selector comes from IO_EVENT_SELECTOR, as in any async application (io-event's
# IO::Event::Selector.new reads it), and evt's the way an application switches to it: RUBYOPT
# loads evt/async, which defines IO::Event::Selector::Evt (EVT_BACKEND picks evt's backend); this
# script knows nothing of evt. Prints "listening on PORT (selector ...)" once the socket is bound on
# 127.0.0.1, with the selector the scheduler really has, so that bin/bench can tell a fallback from
# the real thing.
require_relative "rack_apps"

app_name = ARGV.fetch(0) { abort "usage: falcon_server.rb APP (#{Bench::RackApps::APPS.keys.join(", ")})" }
rack_app = Bench::RackApps.fetch(app_name)

require "async"
require "async/http/endpoint"
require "falcon/server"

endpoint = Async::HTTP::Endpoint.parse("http://127.0.0.1:0").with(reuse_address: true)
middleware = Falcon::Server.rack_middleware(rack_app, verbose: false, cache: false)

Sync do
  bound = endpoint.bound
  port = bound.sockets.first.to_io.local_address.ip_port
  selector = Fiber.scheduler.instance_variable_get(:@selector) # async has no reader for it
  $stdout.puts "listening on #{port} (selector #{selector.inspect})"
  $stdout.flush
  server = Falcon::Server.new(middleware, bound, protocol: endpoint.protocol, scheme: endpoint.scheme)
  server.run.wait
ensure
  bound&.close
end
