# frozen_string_literal: true

# pipe-pingpong: PAIRS pipes, on each a writer writing MESSAGES x 1 KiB and a reader reading them,
# all at once (fibers, or threads for `threads`; `blocking` takes the pairs one after another,
# alternating a write and a read). Prints {"seconds", "cpu_seconds"} as JSON.
#
#   ruby bench/scenarios/programs/pipe_pingpong.rb SUBJECT [PAIRS] [MESSAGES]
require "json"
require_relative "../../subject"

subject = ARGV.fetch(0)
pairs = Integer(ARGV.fetch(1, "50"))
messages = Integer(ARGV.fetch(2, "10000"))
chunk = ("x" * 1024).freeze
received = 0

writer = lambda do |w|
  messages.times { w.write(chunk) }
  w.close
end
reader = lambda do |r|
  buffer = String.new(capacity: 1024)
  received += buffer.bytesize while r.read(1024, buffer)
  r.close
end

clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
started = clock.call
cpu_started = cpu.call
case subject
when "blocking"
  buffer = String.new(capacity: 1024)
  pairs.times do
    r, w = IO.pipe
    messages.times do
      w.write(chunk)
      received += r.read(1024, buffer).bytesize
    end
    w.close
    r.close
  end
when "threads"
  pairs.times.flat_map do
    r, w = IO.pipe
    [Thread.new { writer.call(w) }, Thread.new { reader.call(r) }]
  end.each(&:join)
else
  Bench::Subject.run(subject) do
    pairs.times do
      r, w = IO.pipe
      Fiber.schedule { writer.call(w) }
      Fiber.schedule { reader.call(r) }
    end
  end
end
seconds = clock.call - started
abort "pipe-pingpong: received #{received} bytes, expected #{pairs * messages * 1024}" if received != pairs * messages * 1024
puts JSON.generate(seconds: seconds.round(4), cpu_seconds: (cpu.call - cpu_started).round(4))
