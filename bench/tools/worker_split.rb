# frozen_string_literal: true

# How http-cpu's connections split between two workers, and what the split does to the p99: the
# server (bench/servers/http_cpu_server.rb, 2 workers) on one shared listener and on a socket of
# its own per worker (SO_REUSEPORT), as processes and as Ractors, ROUNDS rounds of the four in turn.
# Each run: wrk's 1 s warm-up, then 5 s measured (-t1 -c100, pinned to CPU 1, as bin/bench runs it);
# the split is the measured run's connections per worker process, read with ss 2 s into it (a
# Ractor server is one process: its split does not show). Medians at the end.
#
#   ruby bench/tools/worker_split.rb [ROUNDS]   (default 8; Linux, with wrk and ss)
require "open3"
require "socket"
require_relative "../driver/wrk_output"

ROOT = File.expand_path("../..", __dir__)
rounds = Integer(ARGV.fetch(0, 8))
abort "worker_split.rb: Linux only (SO_REUSEPORT spreads connections there)" unless RUBY_PLATFORM.include?("linux")

def run(kind, sockets)
  server = IO.popen([RbConfig.ruby, "-I", "#{ROOT}/lib", "-W:no-experimental", "#{ROOT}/bench/servers/http_cpu_server.rb",
                     "2", kind, sockets], err: File::NULL)
  port = Integer(server.gets[/listening on (\d+)/, 1])
  url = "http://127.0.0.1:#{port}/"
  Open3.capture2("taskset", "-c", "1", "wrk", "-t1", "-c100", "-d1s", url)
  measured = Thread.new { Open3.capture2("taskset", "-c", "1", "wrk", "-t1", "-c100", "-d5s", "--latency", url).first }
  sleep 2
  owners, = Open3.capture2("ss", "-tnpH", "state", "established", "( sport = :#{port} )")
  split = owners.scan(/pid=(\d+)/).flatten.tally.values.sort.reverse
  report = measured.value
  {p99: Bench::WrkOutput.p99_ms(report), rps: Float(report[%r{Requests/sec:\s+([\d.]+)}, 1]), split: split}
ensure
  if server
    Process.kill("TERM", server.pid)
    server.close
  end
end

results = Hash.new { |hash, key| hash[key] = [] }
rounds.times do |round|
  [%w[processes shared], %w[ractors shared], %w[processes own], %w[ractors own]].each do |kind, sockets|
    result = run(kind, sockets)
    results[[kind, sockets]] << result
    split = kind == "processes" ? result[:split].join("/") : "-"
    puts format("round %d  %-9s %-6s p99 %7.1f ms  %7.0f req/s  split %s", round + 1, kind, sockets, result[:p99], result[:rps], split)
  end
end
median = ->(values) { values.sort[values.size / 2] }
puts
results.each do |(kind, sockets), list|
  p99s = list.map { |r| r[:p99] }
  puts format("%-9s %-6s p99 median %7.1f ms (%.1f to %.1f)  req/s median %6.0f", kind, sockets, median.(p99s), p99s.min,
              p99s.max, median.(list.map { |r| r[:rps] }))
end
