# frozen_string_literal: true

module Bench
  scenario "soak",
           note: "(requests: served, by the server's count; errors: wrk's socket errors and non-2xx, every check the " \
                 "server makes that failed (message content and order, sleeps or timeouts ending early, Timeout not " \
                 "firing, waiters a close did not end with IOError, any other exception, a fiber stalled " \
                 "#{Soak::STALL_LIMIT.to_i} s) and each activity that made no progress in a row; RSS, fds and CPU from " \
                 "/proc; lazy MB: the part of RSS given back with MADV_FREE (LazyFree in /proc/PID/smaps_rollup), " \
                 "which Linux takes back when it needs memory: Ruby frees the stacks of ended fibers so, and RSS " \
                 "keeps the stacks of the most fibers ever alive at once; held MB: RSS less lazy MB; steal %: of the " \
                 "server's CPU's time in the row, the share the hypervisor gave to others while this machine had " \
                 "work for it (/proc/stat): the server cannot serve then, so req/s and p99 move with it; p99 ms: the " \
                 "keep-alive load's 99th percentile latency (wrk's); objs k " \
                 "(Ruby objects alive, thousands) from GC.stat " \
                 "at the end of each row, with the HTTP connections ended, the fibers that open and close pipes " \
                 "parked where they hold the same ones (so flat means the same count at every row), and " \
                 "Process.warmup run (full GC, compaction, malloc_trim: RSS is what stays, not garbage or memory " \
                 "malloc keeps free); late ms: the latest a sleeper woke in the row)"

  # soak's targets, after the warm-up: RSS and descriptors at every row within this many % of the
  # first row after it, and req/s and p99 (of the keep-alive load) within SOAK_SPEED_PERCENT.
  SOAK_RSS_PERCENT = 2.0
  SOAK_SPEED_PERCENT = 5.0
  # soak's targets in words, for the printed table and the report.
  SOAK_TARGETS = "0 errors; after the warm-up (the first 5 minutes of 30 or more, else a fifth), every row's held " \
                 "memory (RSS less LazyFree) and descriptors within #{SOAK_RSS_PERCENT.to_i} % of the first row after " \
                 "it, req/s and keep-alive p99 within #{SOAK_SPEED_PERCENT.to_i} %".freeze
  # soak's warm-up: the first rows, reported apart and left out of the verdict: 5 minutes of a run
  # of 30 minutes or more, else a fifth of it (a row at least).
  SOAK_WARMUP_LONG = 300
  # soak: seconds bin/bench waits for the server's answer to a sample (it may itself wait up to
  # Soak::SETTLE_LIMIT for its fibers to park) before it calls the server hung.
  SOAK_ANSWER = 60
  # soak: the server's counters that must grow in every row (an activity that stops is an error).
  SOAK_ACTIVITIES = {requests: "HTTP", pipes: "pipes", sleeps: "sleeps", timeouts: "timeouts", queued: "queues",
                     closes: "closes"}.freeze
  # soak's rows: [key, title, width, format].
  SOAK_COLUMNS = [[:t_s, "t s", 5, "%d"], [:requests, "requests", 9, "%d"], [:errors, "errors", 7, "%d"],
                  [:rss_mb, "RSS MB", 7, "%.1f"], [:lazy_mb, "lazy MB", 8, "%.1f"], [:held_mb, "held MB", 8, "%.1f"],
                  [:objects_k, "objs k", 7, "%.1f"], [:fds, "fds", 5, "%d"], [:cpu_pct, "CPU %", 6, "%.1f"],
                  [:steal_pct, "steal %", 8, "%.1f"], [:p99_keepalive_ms, "p99 ms", 7, "%.2f"],
                  [:pipes, "pipes", 8, "%d"], [:sleeps, "sleeps", 8, "%d"], [:timeouts, "timeouts", 9, "%d"],
                  [:queued, "queued", 8, "%d"], [:closes, "closes", 7, "%d"], [:late_ms, "late ms", 8, "%.1f"]].freeze

  # soak: mixed load for minutes on each C backend, a row of the server's figures per interval, and a
  # verdict on them.
  module SoakScenario
    private

  # Every backend of the C extension that runs here (the pure-Ruby select loop is not this code).
  def soak_subjects
    script = 'require "evt"; puts Evt::Loop.backends.select { |b| Evt::Loop.probe(b).nil? } if Evt.extension?'
    out, status = Open3.capture2(*ruby, "-e", script)
    abort "bin/bench: evt does not load" unless status.success?
    names = out.split.map { |name| "evt-#{name}" }
    return [["evt", "the C extension is not loaded, and the soak is about its backends"]] if names.empty?

    names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
    names.map { |name| [name, nil] }
  end

  # bench/servers/soak_server.rb under both wrk loads, a row at the end of every interval: the server's counters,
  # then its RSS, descriptors and CPU time from /proc. A server that dies or stops answering ends
  # the backend's soak with the reason and the start of its stderr; the rows so far stay.
  def soak(subject)
    seconds = @size[:soak]
    interval = seconds >= 180 ? 60 : 5 # at least three rows: the verdict's warm-up and two after it
    log = File.join(ROOT, "tmp/bench/soak.#{subject}.stderr")
    FileUtils.mkdir_p(File.dirname(log))
    figures = {duration_s: seconds, interval_s: interval, intervals: [], stderr_file: relative(log)}
    figures[:paced] = soak_pace if soak_pace
    started = clock
    note "  #{subject}: #{seconds} s, a row every #{interval} s#{soak_paced_text(soak_pace)} (the server's stderr: #{relative(log)})"
    note soak_header
    server = nil
    begin
      server = start_server([*ruby, "bench/servers/soak_server.rb", subject, *("--paced" if soak_pace)], mode: "r+", err: log)
      soak_rows(server, seconds, interval, figures)
    rescue Failure, Timeout::Error, SystemCallError, JSON::ParserError => e
      figures[:error] = soak_death(server, log) || e.message.lines.first.strip
      figures[:stderr] = stderr_lines(log).first(20)
    ensure
      stop(server)
    end
    figures.merge!(soak_verdict(figures))
    note format("  %s: %.0f s, %s", subject, clock - started, figures[:pass] ? "PASS" : "FAIL")
    figures
  end

  # ", paced to R req/s (...)" for a run paced as `paced` (soak_pace's hash) says, else "".
  def soak_paced_text(paced)
    return "" unless paced

    if paced[:wait_ms]
      format(", paced to about %d req/s (each of the %d connections waits %d ms before each request)",
             paced[:rate], Soak::LOADS.sum(&:first), paced[:wait_ms])
    else
      format(", paced to %d req/s (requests start on a fixed schedule; the other activities rest between rounds)", paced[:rate])
    end
  end

  def soak_rows(server, seconds, interval, figures)
    url = "http://127.0.0.1:#{server[:port]}/"
    # The first row counts from the server's start: an error before this sample is one too.
    previous = soak_sample(server).merge(counters: {})
    elapsed = 0
    while elapsed < seconds
      slice = [interval, seconds - elapsed].min
      loads = soak_load(url, slice)
      current = soak_sample(server)
      elapsed += slice
      figures[:intervals] << soak_row(elapsed, previous, current, loads)
      figures[:samples] = current[:counters][:samples]
      note soak_line(figures[:intervals].last)
      previous = current
    end
  end

  # Every wrk load at once, for +seconds+, all on CPU 1; paced with --soak-rate.
  def soak_load(url, seconds)
    threads = Soak::LOADS.map do |connections, headers|
      pace = soak_pace_script(connections)
      arguments = pace ? [*headers, "-s", pace] : headers
      Thread.new { wrk(url, connections, seconds, arguments) }.tap { |t| t.report_on_exception = false }
    end
    outcomes = threads.map do |thread|
      thread.value
    rescue StandardError => e
      e
    end
    failed = outcomes.find { |outcome| outcome.is_a?(Exception) }
    raise failed if failed

    outcomes
  end

  # With --soak-rate R, the wrk script of the load of +connections+: its requests start on a fixed
  # schedule (Bench::WrkSchedule), its share of R (by connections) a second. The script's path,
  # written once per load; nil unpaced.
  def soak_pace_script(connections)
    return nil unless soak_pace

    (@soak_pace_scripts ||= WrkSchedule.scripts(File.join(ROOT, "tmp/bench/soak-pace"), Soak::LOADS, soak_pace[:rate]))[connections]
  end

  # With --soak-rate: {rate:}: the HTTP loads start their requests on a fixed schedule
  # (soak_pace_script), and the server's other activities rest between rounds. A run saved before
  # either has `wait_ms` too (each connection waited that long before each request). nil unpaced.
  def soak_pace
    @options[:soak_rate] && {rate: @options[:soak_rate]}
  end

  # The server's counters (it parks its pipe-making fibers and waits for the HTTP connections to
  # end first), then /proc, then the server goes on.
  def soak_sample(server)
    io = server[:stdout]
    reply = Timeout.timeout(SOAK_ANSWER) do
      io.puts "sample"
      io.flush
      io.gets
    end
    raise Failure, "the server closed its output" unless reply

    counters = JSON.parse(reply, symbolize_names: true)
    raise Failure, "the server's sampler failed: #{counters[:fatal]}" if counters[:fatal]

    pid = server[:pid]
    sample = {counters: counters, rss_mb: proc_rss_mb(pid), lazy_mb: proc_lazy_free_mb(pid), fds: Dir.children("/proc/#{pid}/fd").size,
              cpu: cpu_seconds(pid), steal: cpu_steal_ticks(@cores >= 2 ? 0 : nil), at: clock}
    io.puts "resume"
    io.flush
    sample
  rescue Timeout::Error
    raise Failure, "the server did not answer a sample in #{SOAK_ANSWER} s (its loop hung?)"
  end

  def soak_row(at, before, after, loads)
    count = ->(key) { after[:counters][key].to_i - before[:counters][key].to_i }
    progress = {requests: count.call(:requests), pipes: count.call(:pipes), sleeps: count.call(:sleeps),
                timeouts: count.call(:timeouts_done) + count.call(:timeouts_fired), queued: count.call(:queued),
                closes: count.call(:closes)}
    stalled = SOAK_ACTIVITIES.filter_map { |key, name| name unless progress[key].positive? }
    wrk_errors = loads.sum { |load| load[:errors] }
    server_errors = count.call(:errors)
    {t_s: at, **progress, errors: wrk_errors + server_errors + stalled.size, wrk_errors: wrk_errors,
     server_errors: server_errors, stalled: stalled, wrk_requests: loads.sum { |load| load[:requests] },
     timeouts_fired: count.call(:timeouts_fired), woken: count.call(:woken), late_ms: after[:counters][:late_ms],
     p99_ms: loads.map { |load| load[:p99_ms] }, rss_mb: after[:rss_mb].round(1), lazy_mb: after[:lazy_mb].round(1),
     held_mb: (after[:rss_mb] - after[:lazy_mb]).round(1), fds: after[:fds],
     objects_k: after[:counters][:live_objects].to_i / 1000.0,
     cpu_pct: ((after[:cpu] - before[:cpu]) * 100 / (after[:at] - before[:at])).round(1),
     steal_pct: ((after[:steal][0] - before[:steal][0]) * 100.0 / [after[:steal][1] - before[:steal][1], 1].max).round(1)}
  end

  def soak_header
    SOAK_COLUMNS.map { |_, title, width, _| title.rjust(width) }.join(" ")
  end

  # A row of results saved before a column existed shows "-" there.
  def soak_line(row)
    row = soak_cells(row)
    SOAK_COLUMNS.map { |key, _, width, fmt| (row[key] ? format(fmt, row[key]) : "-").rjust(width) }.join(" ")
  end

  # The memory a row's server holds: RSS less its LazyFree pages (see proc_lazy_free_mb); RSS
  # itself in rows saved before LazyFree was read.
  def soak_held_mb(row) = row[:held_mb] || row[:rss_mb]

  # Why the server is gone, with the first line of its stderr that says what went wrong; nil
  # while it runs.
  def soak_death(server, log)
    return nil unless server

    status = nil
    20.times do # it may still be writing its crash report
      break if (status = Process.waitpid2(server[:pid], Process::WNOHANG)&.last)

      sleep 0.1
    end
    return nil unless status

    how = status.signaled? ? "killed by SIG#{Signal.signame(status.termsig)}" : "exited with status #{status.exitstatus}"
    lines = stderr_lines(log)
    first = lines.find { |l| l =~ /\[BUG\]|Error|error|abort/ } || lines.first
    "the server died (#{how})#{": #{first.strip}" if first}"
  end

  # The warm-up's length in seconds for a run of `seconds`.
  def soak_warmup(seconds) = seconds >= 1800 ? SOAK_WARMUP_LONG : seconds / 5.0

  # Held memory's growth over the rows after the warm-up, in % of its mean: the least-squares
  # line's rise from the first of those rows to the last. A row's own figure moves by about a MB
  # with what malloc holds at that moment; the line shows whether memory grows, the target being
  # still every row's figure.
  def soak_trend(rows)
    xs = rows.map { |row| row[:t_s].to_f }
    ys = rows.map { |row| soak_held_mb(row).to_f }
    mx = xs.sum / xs.size
    my = ys.sum / ys.size
    spread = xs.sum { |x| (x - mx)**2 }
    return 0.0 if spread.zero? || my.zero?

    slope = xs.zip(ys).sum { |x, y| (x - mx) * (y - my) } / spread
    (slope * (xs.last - xs.first) * 100 / my).round(1)
  end

  # The targets: no error at any row; after the warm-up, every row's held memory and descriptors
  # within SOAK_RSS_PERCENT of the first row after it, and its req/s and keep-alive p99 within
  # SOAK_SPEED_PERCENT (the warm-up's rows are reported apart). Each figure's worst row is named.
  def soak_verdict(figures)
    rows = figures[:intervals]
    warmup = soak_warmup(figures[:duration_s])
    warm, after = rows.partition { |row| row[:t_s] <= warmup }
    warm, after = rows.first(1), rows.drop(1) if warm.empty?
    return {pass: false, verdict: "FAIL: #{figures[:error] || "fewer than two rows after the warm-up"}"} if after.size < 2

    errors = rows.sum { |row| row[:errors] }
    base = after.first
    worst = lambda do |key, value = ->(row) { row[key] }|
      change = after.map { |row| [((value.call(row).to_f / value.call(base) - 1) * 100).round(1), row[:t_s]] }.max_by { |pct, _| pct.abs }
      {key => change[0], "#{key}_at": change[1]}
    end
    rps = ->(row) { row[:wrk_requests].to_f / figures[:interval_s] }
    p99 = ->(row) { Array(row[:p99_ms]).first }
    changes = {**worst.call(:held, method(:soak_held_mb)), **worst.call(:rss, ->(row) { row[:rss_mb] }), **worst.call(:fds),
               **worst.call(:rps, rps), **worst.call(:p99, p99)}
    limits = {held: SOAK_RSS_PERCENT, fds: SOAK_RSS_PERCENT, rps: SOAK_SPEED_PERCENT, p99: SOAK_SPEED_PERCENT}
    trend = soak_trend(after)
    failed = []
    failed << figures[:error] if figures[:error]
    failed << "errors" unless errors.zero?
    limits.each { |key, limit| failed << key.to_s unless changes[key].abs <= limit }
    text = format("%d errors (target 0); warm-up %d s (%d rows: held %.1f to %.1f MB, RSS %.1f to %.1f MB); after it, against the row at %d s: ",
                  errors, warmup, warm.size, soak_held_mb(warm.first), soak_held_mb(warm.last), warm.first[:rss_mb],
                  warm.last[:rss_mb], base[:t_s]) +
           limits.map { |key, limit| format("%s %+.1f %% at worst (at %d s; target within %.0f %%)", key, changes[key], changes[:"#{key}_at"], limit) }
                 .join(", ") + format(" (RSS %+.1f %% at worst, at %d s, LazyFree included; held memory's line through the " \
                                      "rows after the warm-up: %+.1f %% over them)", changes[:rss], changes[:rss_at], trend)
    {errors: errors, warmup_s: warmup, warmup_rows: warm.size, changes: changes, pass: failed.empty?,
     held_change_percent: changes[:held], held_trend_percent: trend, rss_change_percent: changes[:rss],
     fds_first: base[:fds], fds_last: rows.last[:fds],
     verdict: failed.empty? ? "PASS: #{text}" : "FAIL (#{failed.join(", ")}): #{text}"}
  end

  def print_soak
    rows = @results.select { |r| r[:scenario] == "soak" }
    puts
    puts "soak (#{description("soak")})"
    puts "targets: #{SOAK_TARGETS}"
    rows.each do |row|
      puts
      next puts "#{row[:subject]}  n/a: #{row[:skipped]}" if row[:skipped]

      puts "#{row[:subject]}: #{row[:duration_s]} s, a row every #{row[:interval_s]} s#{soak_paced_text(row[:paced])}"
      puts soak_header
      row[:intervals].each { |interval| puts soak_line(interval) }
      soak_problems(row).each { |line| puts "  #{line}" }
      puts "verdict #{row[:subject]}: #{row[:verdict]}"
    end
    measured = rows.reject { |r| r[:skipped] }
    if measured.size > 1
      passed, failed = measured.partition { |r| r[:pass] }
      puts
      puts "soak: #{[("PASS on #{passed.map { |r| r[:subject] }.join(", ")}" if passed.any?),
                     ("FAIL on #{failed.map { |r| r[:subject] }.join(", ")}" if failed.any?)].compact.join("; ")}"
    end
    puts NOTES["soak"]
    $stdout.flush
  end

  # What the errors were: the server's samples (the first kinds, with their counts), wrk's, the
  # activities that stalled, and a failure with the start of the server's stderr.
  def soak_problems(row)
    lines = (row[:samples] || {}).map { |text, count| "error x#{count}: #{text}" }
    row[:intervals].each do |interval|
      lines << "at #{interval[:t_s]} s: #{interval[:wrk_errors]} wrk errors (socket or non-2xx)" if interval[:wrk_errors].positive?
      lines << "at #{interval[:t_s]} s: no progress in #{interval[:stalled].join(", ")}" if interval[:stalled].any?
    end
    if row[:error]
      lines << "FAILED: #{row[:error]}"
      lines.concat(row[:stderr].first(8).map { |line| "  stderr: #{line}" }) if row[:stderr]&.any?
      lines << "  (the whole stderr: #{row[:stderr_file]})"
    end
    lines
  end
  # A row as SOAK_COLUMNS shows it: its keep-alive load's p99 (the first of p99_ms, one per load).
  def soak_cells(row)
    row.merge(p99_keepalive_ms: Array(row[:p99_ms]).first)
  end
  module_function :soak_problems, :soak_cells
  end
end
