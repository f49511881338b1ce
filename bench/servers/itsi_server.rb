# frozen_string_literal: true

# The falcon scenario's itsi-* servers: Itsi (the itsi-server gem, a Rack server written in Rust)
# run as its users run it, the `itsi` command with an Itsi.rb (bench/servers/itsi_config.rb), serving one of
# bench/servers/rack_apps.rb's apps with one worker process, one thread and a fiber scheduler.
#
#   ruby -rbundler/setup bench/servers/itsi_server.rb SCHEDULER APP      (Evt::Scheduler or Async::Scheduler)
#
# Prints "listening on PORT (scheduler ...)" once Itsi's after_start hook says it is up, then waits for
# Itsi and ends as it ends. Itsi's own output (it logs to stdout) goes to this script's stderr. Itsi
# takes no port 0: the port is a free one chosen here, chosen again if it was taken meanwhile.
require "fileutils"
require "rbconfig"
require "socket"

scheduler, app = ARGV
abort "usage: itsi_server.rb SCHEDULER APP" unless scheduler && app
START_LIMIT = 30 # seconds

itsi = Gem.bin_path("itsi-server", "itsi")
config = File.expand_path("itsi_config.rb", __dir__)
evt_lib = File.expand_path("../../lib", __dir__)
# Where Itsi runs: it writes its pid file (.itsi.pid) there.
workdir = File.expand_path("../../tmp/bench", __dir__)
FileUtils.mkdir_p(workdir)

pid = nil
3.times do
  port = TCPServer.open("127.0.0.1", 0) { |server| server.local_address.ip_port }
  reader, writer = IO.pipe
  env = {"BENCH_ITSI_PORT" => port.to_s, "BENCH_ITSI_SCHEDULER" => scheduler, "BENCH_ITSI_APP" => app,
         "BENCH_ITSI_READY_FD" => writer.fileno.to_s,
         "RUBYLIB" => [evt_lib, ENV.fetch("RUBYLIB", nil)].compact.join(File::PATH_SEPARATOR)}
  # In this process group (bin/bench stops the group), in the same bundle as this script.
  pid = Process.spawn(env, RbConfig.ruby, *("-rbundler/setup" if defined?(Bundler)), itsi, "-C", config,
                      chdir: workdir, writer => writer, out: $stderr)
  writer.close
  ready = reader.wait_readable(START_LIMIT) && reader.gets
  reader.close
  if ready
    $stdout.puts "listening on #{port} (scheduler #{ready.strip})"
    $stdout.flush
    _, status = Process.wait2(pid)
    exit(status.success? ? 0 : 1)
  end

  begin
    Process.kill(:KILL, pid)
  rescue Errno::ESRCH
    nil
  end
  _, status = Process.wait2(pid)
  abort "itsi_server.rb: Itsi did not start in #{START_LIMIT} s" if status.signaled?
  warn "itsi_server.rb: Itsi ended before it was ready (#{status.inspect}); trying another port"
end
abort "itsi_server.rb: Itsi did not start three times"
