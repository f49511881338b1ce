# frozen_string_literal: true

require "httpx"

module Evt
  # httpx's `fiber_concurrency` plugin, with the one change a session shared by fibers needs so
  # that none of them sleeps out its operation timeout (60 s by default) on any Fiber Scheduler.
  # `require "evt/httpx"` registers it as `:evt_fiber_concurrency`.
  #
  # Why: a request's fiber ends by closing its session's connections (httpx closes every request's
  # connections unless the session is persistent). A connection whose only pending request is
  # another fiber's, which the server's `Connection: close` has just sent back to the connection's
  # queue, is not "in flight" to httpx, so the closing fiber waits for it, yet has no interest of
  # its own in it: httpx's selector then calls `IO.select(nil, nil, nil, timeout)`, a sleep that
  # nothing wakes. Whether a fiber gets there depends only on which of the fibers waiting on the
  # socket runs first when it becomes readable: any order is legal, and docs/clients.md shows the
  # ones that hang under evt and under async. The change counts such a connection as in flight: it
  # is the other fiber's to finish, and that fiber closes it when its own request ends.
  #
  # @example A session shared by the fibers of a scheduler
  #   require "evt/httpx"
  #   session = HTTPX.plugin(:evt_fiber_concurrency)   # instead of HTTPX.plugin(:fiber_concurrency)
  module HTTPXFiberConcurrency
    # httpx's plugin protocol: this plugin is fiber_concurrency's, with one method changed.
    # @param klass [Class] the session class the plugin is added to
    # @return [void]
    def self.load_dependencies(klass)
      klass.plugin(:fiber_concurrency)
    end

    # Mixed into the session's connections, after fiber_concurrency's own methods.
    module ConnectionMethods
      # @return [Boolean] true also while a request of another fiber waits on this connection
      def inflight?
        super || pending.any? { |request| !request.current_context? }
      end
    end
  end

  HTTPX::Plugins.register_plugin(:evt_fiber_concurrency, HTTPXFiberConcurrency)
end
