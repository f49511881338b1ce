# frozen_string_literal: true

# bin/bench's demo: each subject in a fresh server process under wrk -c100, keep-alive.
require "etc"
require "evt"

duration = Integer(ARGV.fetch(0, "5"))
cores = Etc.nprocessors
pin_server = cores >= 2 ? %w[taskset -c 0] : []
pin_wrk = cores >= 2 ? %w[taskset -c 1] : []
hz = Etc.sysconf(Etc::SC_CLK_TCK)

# user+system CPU seconds of a process, from /proc.
cpu_seconds = lambda do |pid|
  fields = File.read("/proc/#{pid}/stat").split(") ").last.split
  (Integer(fields[11]) + Integer(fields[12])).fdiv(hz)
end

subjects = Evt::Scheduler.availables.map { |name| "evt-#{name}" } + %w[threads blocking]
puts "evt #{Evt::VERSION} on Ruby #{RUBY_VERSION}, #{cores} cores; http-keepalive, wrk -c100 -t1 -d#{duration}s"
puts format("%-14s %12s %18s %10s", "subject", "req/s", "server CPU us/req", "p99 ms")
subjects.each do |subject|
  $stderr.print "#{subject}: running...\r"
  server = IO.popen([*pin_server, RbConfig.ruby, "-Ilib", "bench/http_server.rb", subject], err: File::NULL)
  port = server.gets[/\d+/] or abort "#{subject}: the server did not start"
  url = "http://127.0.0.1:#{port}/"
  connections = subject == "blocking" ? 1 : 100
  system(*pin_wrk, "wrk", "-t1", "-c#{connections}", "-d1s", url, out: File::NULL) # warm-up
  before = cpu_seconds.call(server.pid)
  report = IO.popen([*pin_wrk, "wrk", "-t1", "-c#{connections}", "-d#{duration}s", "--latency", url], &:read)
  used = cpu_seconds.call(server.pid) - before
  Process.kill(:TERM, server.pid)
  server.close
  requests = report[/(\d+) requests in/, 1].to_i
  rps = report[%r{Requests/sec:\s+([\d.]+)}, 1].to_f
  p99 = report[/99%\s+([\d.]+)(us|ms|s)/] && begin
    value = Regexp.last_match(1).to_f
    { "us" => value / 1000, "ms" => value, "s" => value * 1000 }.fetch(Regexp.last_match(2))
  end
  cpu = requests.positive? ? used * 1e6 / requests : Float::NAN
  puts format("%-14s %12.0f %18.1f %10.2f", subject, rps, cpu, p99 || Float::NAN)
end
puts "(blocking serves one connection at a time: wrk -c1)"
