# frozen_string_literal: true

# close-waiters: N readers blocked on N pipes (fibers, or threads for `threads`), then every read end
# closed from another fiber (thread); Ruby Bug #18455. A round measures the closes alone; `woken`
# counts the readers the closes themselves ended (IOError), before any write end is closed. Small N
# take several rounds (the median is reported). A reader the close does not wake is a hang: the
# round stops waiting after a second and says so.
# Prints {"n", "close_avg_us", "woken", "rounds", "hang"} as JSON.
#
#   ruby bench/scenarios/programs/close_waiters.rb SUBJECT N
require "json"
require_relative "../../subject"

subject = ARGV.fetch(0)
count = Integer(ARGV.fetch(1, "1000"))
rounds = (4000 / count).clamp(3, 50)
clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }

# One round: the readers start and block, then the closer runs. `pause` lets the event loop (or the
# threads) reach the kernel, so the readers really wait there.
round = lambda do |pause, spawn|
  pipes = Array.new(count) { IO.pipe }
  woken = 0
  start_reader = lambda do |r|
    r.read(1)
  rescue IOError
    woken += 1
  end
  readers = pipes.map { |r, _| spawn.call(proc { start_reader.call(r) }) } # async passes its task: a proc takes it
  pause.call(readers)
  started = clock.call
  pipes.each { |r, _| r.close }
  seconds = clock.call - started
  deadline = clock.call + 1.0
  pause.call(readers) while woken < count && clock.call < deadline
  [seconds * 1e6 / count, woken, pipes]
end

results = []
finish = lambda do
  averages = results.map(&:first).sort
  woken = results.map { |r| r[1] }.min
  puts JSON.generate(n: count, close_avg_us: averages[averages.size / 2].round(2), woken: woken,
                     rounds: results.size, hang: woken < count)
  $stdout.flush
  # Readers left hanging (a scheduler whose close woke nobody) would keep the process alive.
  Process.exit!(0)
end
keep = [] # after a hang the write ends stay open: closing them would wake what the close did not

# Every round, until one leaves readers hanging; then the figures, and the end of the process.
measure = lambda do |pause, spawn|
  rounds.times do
    avg, woken, pipes = round.call(pause, spawn)
    results << [avg, woken]
    break keep.concat(pipes.map(&:last)) if woken < count

    pipes.each { |_, w| w.close }
  end
  finish.call
end

if subject == "threads"
  all_blocked = lambda do |threads|
    Thread.pass until threads.all? { |t| t.status == "sleep" || !t.alive? }
    sleep 0.001
  end
  measure.call(all_blocked, ->(reader) { Thread.new(&reader) })
else
  Bench::Subject.run(subject) do
    Fiber.schedule { measure.call(->(_) { sleep 0.001 }, ->(reader) { Fiber.schedule(&reader) }) }
  end
end
