# frozen_string_literal: true

# Itsi's configuration (an Itsi.rb) for the falcon scenario's itsi-* subjects, filled in by
# bench/servers/itsi_server.rb through the environment: one process (workers 1), one Ruby thread, the fiber
# scheduler named by BENCH_ITSI_SCHEDULER (Evt::Scheduler or Async::Scheduler), one of
# bench/servers/rack_apps.rb's apps (BENCH_ITSI_APP).
require_relative "rack_apps"
scheduler = ENV.fetch("BENCH_ITSI_SCHEDULER")
require scheduler.start_with?("Evt::") ? "evt" : "async"

workers 1
threads 1
fiber_scheduler scheduler
bind "http://127.0.0.1:#{ENV.fetch("BENCH_ITSI_PORT")}"
log_level :warn
# Itsi answers 503 once this many requests wait for the Ruby thread (30 per thread by default):
# room for wrk's 100 connections, so that a 503 means the thread stopped taking requests.
ruby_thread_request_backlog_size 1024
run Bench::RackApps.fetch(ENV.fetch("BENCH_ITSI_APP"))

# Tells bench/servers/itsi_server.rb that the listener is bound, and on which scheduler the requests run.
after_start do
  ready = IO.for_fd(Integer(ENV.fetch("BENCH_ITSI_READY_FD")), autoclose: true)
  ready.puts(scheduler)
  ready.close
end
