# frozen_string_literal: true

# Where http-redis's CPU per request goes, subject by subject: the server
# (bench/servers/http_redis_server.rb, pool of 32) pinned to CPU 0, redis-server and wrk (-t1 -c100)
# pinned to CPU 1, as bin/bench runs them; the subjects take turns, ROUNDS rounds. Each run: a 2 s
# warm-up, then S seconds measured. Per request it reports:
#   CPU µs      the server's CPU time over the requests wrk counted;
#   p99         wrk's 99th percentile latency of the measured run (the hooks run's is not kept);
#   redis sw    redis-server's context switches: each is a sleep the server's next command woke it from,
#               a wakeup the server's own send(2) pays for on loopback;
#   perf shares (with --perf, a `perf record -g` of the measured run) of the server's samples: the
#               kernel, Ruby, the scheduler's own library, and the sends (send, sendmsg, io_uring
#               submissions, children included);
#   hooks       (with --hooks, a separate run with bench/tools/hook_counts.rb loaded) the scheduler hooks
#               Ruby called, the pool's waits (ConditionVariable#wait), and its checkouts by how often
#               each waited (pop_w0 to pop_w3), per request.
# Medians at the end. Linux, with wrk, redis-server, taskset (and perf for --perf).
#
#   ruby [--yjit] bench/tools/http_redis_split.rb SUBJECT,.. [ROUNDS] [--seconds S] [--perf] [--hooks]
require "open3"
require "optparse"
require "socket"
require "tmpdir"
require "etc"
require_relative "../driver/wrk_output"

ROOT = File.expand_path("../..", __dir__)
KEY = "evt:bench:greeting"

options = {seconds: 5}
arguments = OptionParser.new do |parser|
  parser.banner = "usage: http_redis_split.rb SUBJECT,.. [ROUNDS] [--seconds S] [--perf] [--hooks]"
  parser.on("--seconds S", Integer, "each measured run (default 5)") { |value| options[:seconds] = value }
  parser.on("--perf", "perf record each measured run") { options[:perf] = true }
  parser.on("--hooks", "count the hooks in a run of their own") { options[:hooks] = true }
end.parse(ARGV)
seconds = options[:seconds]
subjects = arguments.fetch(0) { abort "usage: http_redis_split.rb SUBJECT,.. [ROUNDS] [--seconds S] [--perf] [--hooks]" }.split(",")
rounds = Integer(arguments.fetch(1, 3))
ruby = [RbConfig.ruby, *("--yjit" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?)]

def free_port = TCPServer.open("127.0.0.1", 0) { |probe| probe.local_address.ip_port }
def cpu_ticks(pid) = File.read("/proc/#{pid}/stat").split(") ").last.split[11, 2].sum(&:to_i)
def switches(pid) = File.read("/proc/#{pid}/status").scan(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)/).flatten.sum(&:to_i)

# wrk's requests and its 99th percentile latency in ms.
def wrk(port, seconds)
  out, = Open3.capture2("taskset", "-c", "1", "wrk", "-t1", "-c100", "-d#{seconds}s", "--latency", "http://127.0.0.1:#{port}/")
  [Integer(out[/(\d+) requests in/, 1]), Bench::WrkOutput.p99_ms(out) || raise("wrk printed no 99th percentile: #{out}")]
end

def with_redis
  port = free_port
  Dir.mktmpdir("evt-redis-split-") do |dir|
    pid = Process.spawn("taskset", "-c", "1", "redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", dir, "--loglevel", "warning", out: File::NULL, err: File::NULL)
    begin
      socket = begin
        TCPSocket.new("127.0.0.1", port)
      rescue Errno::ECONNREFUSED
        sleep 0.05
        retry
      end
      socket.write("*3\r\n$3\r\nSET\r\n$#{KEY.bytesize}\r\n#{KEY}\r\n$5\r\nhello\r\n")
      raise "redis-server did not take the key" unless socket.gets == "+OK\r\n"

      socket.close
      yield port, pid
    ensure
      Process.kill("TERM", pid)
      Process.wait(pid)
    end
  end
end

# SIGTERM, then SIGKILL after 2 s: a peer's loop may leave a signal pending while it waits idle.
def stop(server)
  Process.kill("TERM", server.pid)
  ended = nil
  20.times { (ended = Process.waitpid(server.pid, Process::WNOHANG)) ? break : sleep(0.1) }
  Process.kill("KILL", server.pid) unless ended
rescue Errno::ECHILD, Errno::ESRCH
  nil # ended already
ensure
  server.close
end

# perf report's share (children included) of each symbol in `symbols`, and of each DSO.
def perf_shares(data)
  children, = Open3.capture2("perf", "report", "-i", data, "--children", "-g", "none", "--sort", "sym", err: File::NULL)
  dsos, = Open3.capture2("perf", "report", "-i", data, "--no-children", "-g", "none", "--sort", "dso", err: File::NULL)
  share = ->(text, name) { text[/^\s+([\d.]+)%.*\s#{Regexp.escape(name)}\s*$/, 1].to_f }
  library = dsos.lines.grep(/evt\.so|um_ext|io_event|carbon/).sum { |line| line.to_f }
  sends = %w[__send __libc_sendmsg io_submit_sqes].sum { |name| share.(children, name) }
  {kernel: share.(dsos, "[kernel.kallsyms]"), ruby: dsos.lines.grep(/libruby/).sum(&:to_f), library: library, sends: sends}
end

def run(ruby, subject, seconds, perf: false, hooks: false)
  with_redis do |redis_port, redis_pid|
    preload = hooks ? ["-r#{ROOT}/bench/tools/hook_counts.rb"] : []
    env = {"BUNDLE_WITH" => "bench", "BUNDLE_GEMFILE" => File.join(ROOT, "Gemfile")}
    server = IO.popen(env, ["taskset", "-c", "0", *ruby, "-I#{ROOT}/lib", "-rbundler/setup", *preload,
                            "#{ROOT}/bench/servers/http_redis_server.rb", subject, redis_port.to_s, "32"],
                      "r+", err: hooks ? %i[child out] : File::NULL)
    begin
      port = Integer(server.gets[/listening on (\d+)/, 1])
      warm, = wrk(port, 2)
      ticks, redis_switches = cpu_ticks(server.pid), switches(redis_pid)
      data = File.join(Dir.tmpdir, "evt-redis-split-#{subject}.perf")
      recorder = Process.spawn("perf", "record", "-F", "2000", "-g", "-p", server.pid.to_s, "-o", data, "--", "sleep",
                               seconds.to_s, out: File::NULL, err: File::NULL) if perf
      requests, p99 = wrk(port, seconds)
      result = {cpu_us: (cpu_ticks(server.pid) - ticks) * 1e6 / Etc.sysconf(Etc::SC_CLK_TCK) / requests, p99_ms: p99,
                redis_switches: (switches(redis_pid) - redis_switches).fdiv(requests)}
      Process.wait(recorder) if recorder
      result.merge!(perf_shares(data)) if perf
      if hooks
        server.puts "counts"
        said = []
        while (line = server.gets) && !line.start_with?("hook counts ")
          said << line
        end
        raise "#{subject}: the server printed no hook counts: #{said.join.strip}" unless line

        counts = eval(line.delete_prefix("hook counts ")) # rubocop:disable Security/Eval -- our own output: a Hash
        result[:hooks] = counts.transform_values { |count| count.fdiv(warm + requests) }
      end
      result
    ensure
      stop(server)
    end
  end
end

results = Hash.new { |hash, key| hash[key] = [] }
rounds.times do |round|
  subjects.each do |subject|
    result = run(ruby, subject, seconds, perf: options[:perf])
    result[:hooks] = run(ruby, subject, seconds, hooks: true)[:hooks] if options[:hooks]
    results[subject] << result
    shares = format("  kernel %4.1f %%  ruby %4.1f %%  scheduler lib %3.1f %%  sends %4.1f %%", *result.values_at(:kernel, :ruby, :library, :sends)) if result[:kernel]
    hooks = "  hooks/req #{result[:hooks].map { |name, count| format("%s %.2f", name, count) }.join(", ")}" if result[:hooks]
    puts format("round %d  %-14s CPU %6.1f µs/req  p99 %6.1f ms  redis sw %.2f/req%s%s", round + 1, subject, result[:cpu_us],
                result[:p99_ms], result[:redis_switches], shares, hooks)
  end
end
median = ->(values) { values.sort[values.size / 2] }
puts
results.each do |subject, list|
  line = format("%-14s CPU median %6.1f µs/req (%.1f to %.1f)  p99 %6.1f ms  redis sw %.2f/req", subject,
                median.(list.map { _1[:cpu_us] }), list.map { _1[:cpu_us] }.min, list.map { _1[:cpu_us] }.max,
                median.(list.map { _1[:p99_ms] }), median.(list.map { _1[:redis_switches] }))
  line += format("  kernel %4.1f %%  ruby %4.1f %%  scheduler lib %3.1f %%  sends %4.1f %%",
                 *%i[kernel ruby library sends].map { |key| median.(list.map { _1[key] }) }) if list.first[:kernel]
  if list.first[:hooks]
    names = list.flat_map { _1[:hooks].keys }.uniq.sort
    line += "  hooks/req #{names.map { |name| format("%s %.2f", name, median.(list.map { _1[:hooks].fetch(name, 0) })) }.join(", ")}"
  end
  puts line
end
