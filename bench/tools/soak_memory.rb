# frozen_string_literal: true

# Where the soak server's held memory goes, by subject: bench/servers/soak_server.rb paced as
# `bin/bench --soak-rate 6000` runs it (both wrk loads on their schedules, the other activities
# resting), sampled every SECONDS. Each sample, taken as bin/bench takes it (the activities parked,
# the connections ended, Process.warmup run), splits the server's held memory (RSS less LazyFree,
# /proc/PID/smaps) into Ruby's object heap (GC.stat's pages), the main malloc arena (the [heap]
# mapping) and the rest (other malloc arenas, fiber and thread stacks, libraries). Run it for evt
# and a peer: memory that grows alike under both is the program's and Ruby's, not the scheduler's.
#
#   ruby [--yjit] bench/tools/soak_memory.rb [SUBJECTS] [SAMPLES] [SECONDS]   (evt-io_uring,async-epoll 16 30)
#
# The peers' subjects (async-epoll...) load their gems through Bundler: BUNDLE_WITH=bench.
require "json"
require "rbconfig"
require_relative "../driver/wrk_schedule"
require_relative "../servers/soak_server"

ROOT = File.expand_path("../..", __dir__)
RATE = 6000
subjects = ARGV.fetch(0, "evt-io_uring,async-epoll").split(",")
samples = Integer(ARGV.fetch(1, "16"))
seconds = Integer(ARGV.fetch(2, "30"))

# {total:, brk:} kB of resident memory not lazily freed, in all and in the [heap] mapping.
def held_kb(pid)
  held = Hash.new(0)
  name = nil
  File.foreach("/proc/#{pid}/smaps") do |line|
    if line.match?(/\A\h+-\h+ /) then name = line.split[5]
    elsif (kb = line[/\ARss:\s+(\d+)/, 1]) then held[:total] += kb.to_i; held[:brk] += kb.to_i if name == "[heap]"
    elsif (kb = line[/\ALazyFree:\s+(\d+)/, 1]) then held[:total] -= kb.to_i; held[:brk] -= kb.to_i if name == "[heap]"
    end
  end
  held
end

mb = ->(kb) { format("%.1f", kb / 1024.0) }
scripts = Bench::WrkSchedule.scripts(File.join(ROOT, "tmp/bench/soak-memory"), Bench::Soak::LOADS, RATE)
ruby = [RbConfig.ruby, *("--yjit" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?), "-I#{File.join(ROOT, "lib")}"]
puts "soak server paced to #{RATE} req/s, a sample every #{seconds} s, Ruby #{RUBY_VERSION}#{" with YJIT" if ruby.include?("--yjit")}"
subjects.each do |subject|
  command = ["taskset", "-c", "0", *ruby, *("-rbundler/setup" unless subject.start_with?("evt-")),
             File.join(ROOT, "bench/servers/soak_server.rb"), subject, "--paced"]
  server = IO.popen(command, "r+", err: File::NULL, chdir: ROOT)
  port = server.gets.to_s[/listening on (\d+)/, 1] or abort "soak_memory: #{subject}: the server did not start"
  puts
  puts "#{subject}   (MB; heap: Ruby's object heap; brk: the main malloc arena; rest: the others, stacks, libraries)"
  puts format("%8s %7s %7s %7s %7s %8s %7s", "t s", "held", "heap", "brk", "rest", "objects", "errors")
  samples.times do |i|
    server.puts "sample"
    figures = JSON.parse(server.gets.to_s)
    abort "soak_memory: #{subject}: #{figures["fatal"]}" if figures["fatal"]
    held = held_kb(server.pid)
    rest = held[:total] - figures["heap_kb"] - held[:brk]
    row = [held[:total], figures["heap_kb"], held[:brk], rest]
    puts format("%8d %7s %7s %7s %7s %8d %7d", i * seconds, *row.map(&mb), figures["live_objects"], figures["errors"])
    server.puts "resume"
    break if i == samples - 1

    loads = Bench::Soak::LOADS.map do |connections, headers|
      spawn("taskset", "-c", "1", "wrk", "-t1", "-c#{connections}", "-d#{seconds}s", *headers, "-s", scripts[connections],
            "http://127.0.0.1:#{port}/", out: File::NULL)
    end
    loads.each { |pid| Process.wait(pid) }
  end
  server.close
end
