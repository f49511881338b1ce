# frozen_string_literal: true

# What one waiting fiber costs, by what it waits in: FIBERS fibers all alive at once under a
# bin/bench subject's scheduler, each in one kind of wait: `sleep 3600`, `IO#wait_readable`, or
# `IO#read(1)` (100 fibers on each UNIX socket, none of which gets data). Bytes of RSS per fiber, a
# process per kind. A fiber's machine stack is counted by the pages its deepest call touched: a
# read waits deeper than a sleep (Ruby's IO#read reaches the scheduler's io_read through its own
# frames first), and the table shows when that costs a page more.
#
#   ruby [--yjit] bench/tools/fiber_memory_by_wait.rb [SUBJECT] [FIBERS]   (evt-epoll, 20000)
#   ruby [--yjit] bench/tools/fiber_memory_by_wait.rb SUBJECT FIBERS KIND   (one kind, as JSON)
#
# The peers' subjects (async-epoll...) load their gems through Bundler: BUNDLE_WITH=bench.
require "json"
require "rbconfig"
require "socket"
require_relative "../subject"

KINDS = %w[sleep wait_readable read].freeze
subject = ARGV.fetch(0, "evt-epoll")
count = Integer(ARGV.fetch(1, "20000"))
kind = ARGV[2]

unless kind
  puts "#{subject}, #{count} fibers, Ruby #{RUBY_VERSION}#{" with YJIT" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?}"
  KINDS.each do |each_kind|
    ruby = [RbConfig.ruby, *("--yjit" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?), "-I#{File.expand_path("../../lib", __dir__)}"]
    ruby << "-rbundler/setup" unless subject.start_with?("evt-")
    out = IO.popen([*ruby, __FILE__, subject, count.to_s, each_kind], err: File::NULL, &:read)
    result = begin
      JSON.parse(out.lines.last.to_s)
    rescue JSON::ParserError
      nil
    end
    puts format("  %-14s %s", each_kind, result ? "#{result["bytes_per_fiber"]} bytes/fiber" : "failed")
  end
  exit
end

abort "fiber_memory_by_wait: KIND is one of #{KINDS.join(", ")}" unless KINDS.include?(kind)
pairs = Array.new([count / 100, 1].max) { UNIXSocket.pair }
rss = -> { GC.start; File.read("/proc/self/status")[/^VmRSS:\s+(\d+) kB/, 1].to_i * 1024 }
Bench::Subject.run(subject) do
  before = rss.call
  count.times do |i|
    io = pairs[i % pairs.size].first
    case kind
    when "sleep" then Fiber.schedule { sleep 3600 }
    when "wait_readable" then Fiber.schedule { io.wait_readable }
    else Fiber.schedule { io.read(1) }
    end
  end
  puts JSON.generate(kind: kind, bytes_per_fiber: ((rss.call - before) / count).round)
  $stdout.flush
  exit!(0) # the fibers never wake
end
