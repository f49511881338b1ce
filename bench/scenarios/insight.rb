# frozen_string_literal: true

module Bench
  scenario "insight-cost",
           metric: :stall_keepalive_pct,
           note: "(per C backend, three servers at once on the same CPU: evt-<backend>, evt-<backend>-stall (stall " \
                 "reports on, threshold 100 ms, nothing trips them) and evt-<backend>-stats (a fiber reads " \
                 "scheduler.stats once a second); for each load, rounds in which three wrk load the three servers " \
                 "at once; CPU ns per request of each server in each round, every thread's, from " \
                 "/proc/PID/task/*/schedstat; a cost is the median over the rounds of that round's (server's CPU " \
                 "per request / base's - 1): whatever else the machine does falls on the three servers alike " \
                 "within a round; spread: [p25, p75] of the rounds' costs, or with --repeat every run's cost, the " \
                 "cost being their median; base us/req: the median of the base server's rounds, three servers " \
                 "sharing one CPU)"

  # insight-cost: rounds per load (full and --quick), and the seconds each round lasts.
  INSIGHT_ROUNDS = {full: 12, quick: 3}.freeze
  INSIGHT_ROUND_SECONDS = 5
  # insight-cost's loads: [name, wrk's headers].
  INSIGHT_LOADS = [["keepalive", []], ["close", ["-H", "Connection: close"]]].freeze
  # insight-cost's columns: [key, title, format].
  INSIGHT_COLUMNS = INSIGHT_LOADS.flat_map do |load, _|
    [[:"base_#{load}_us", "#{load} us/req", "%.2f"],
     *Subject::INSIGHT.keys.flat_map do |kind|
       [[:"#{kind}_#{load}_pct", "#{kind} %", "%+.2f"], [:"#{kind}_#{load}_spread", "spread", "%s"]]
     end]
  end.freeze

  # insight-cost: what stall reports and a stats reader cost evt per request, measured in pairs.
  module InsightScenario
    private

    # The C backends evt runs here (those --subjects names as evt-<backend>, if it names any).
    def insight_subjects
      names = evt_backends.reject { |name| @emulated.key?("evt-#{name}") }.map { |name| "evt-#{name}" }
      names &= @options[:subjects] if @options[:subjects]&.intersect?(names)
      names.map { |name| [name, nil] }
    end

    # The three servers of +subject+ under each load in turn; the figures of INSIGHT_COLUMNS.
    def insight_cost(subject)
      names = [subject, *Subject::INSIGHT.keys.map { |kind| "#{subject}-#{kind}" }]
      servers = []
      names.each { |name| servers << start_server([*ruby_for(name), "bench/servers/http_server.rb", name]) }
      urls = servers.map { |server| "http://127.0.0.1:#{server[:port]}/" }
      figures = {rounds: @size[:insight_rounds], round_s: INSIGHT_ROUND_SECONDS, connections: @connections, errors: 0}
      INSIGHT_LOADS.each do |load, headers|
        urls.each { |url| wrk(url, @connections, @size[:warmup], headers) }
        per_request = insight_turns(servers, urls, headers, figures)
        base = per_request.first
        figures[:"base_#{load}_us"] = (median(base) / 1000).round(2)
        Subject::INSIGHT.keys.zip(per_request.drop(1)) do |kind, spent|
          costs = spent.zip(base).map { |with, without| (with / without - 1) * 100 }
          figures[:"#{kind}_#{load}_pct"] = median(costs).round(2)
          figures[:"#{kind}_#{load}_spread"] = format("[%+.1f, %+.1f]", percentile(costs, 25), percentile(costs, 75))
        end
      end
      figures
    ensure
      servers&.each { |server| stop(server) }
    end

    # CPU ns per request of each server in each round: [[per round] per server]. The servers are
    # loaded at once, each by its own wrk, so whatever else the machine does (another guest's
    # steal above all) falls on the three alike within a round.
    def insight_turns(servers, urls, headers, figures)
      spent = servers.map { [] }
      @size[:insight_rounds].times do
        before = servers.map { |server| threads_cpu_ns(server[:pid]) }
        loads = urls.map { |url| Thread.new { wrk(url, @connections, INSIGHT_ROUND_SECONDS, headers) }.tap { |t| t.report_on_exception = false } }
        reports = loads.map(&:value)
        servers.each_with_index do |server, i|
          spent[i] << (threads_cpu_ns(server[:pid]) - before[i]).fdiv(reports[i][:requests])
          figures[:errors] += reports[i][:errors]
        end
      end
      spent
    end

    # CPU time of every thread of +pid+ so far, in ns (schedstat counts in ns; /proc/PID/stat in
    # ticks of 10 ms, coarse beside a round).
    def threads_cpu_ns(pid)
      Dir.glob("/proc/#{pid}/task/*/schedstat").sum do |path|
        Integer(File.read(path).split.first)
      rescue Errno::ENOENT, Errno::ESRCH
        0 # a thread that ended meanwhile
      end
    end

    # --repeat: each figure the median of the runs', every run's cost as its spread.
    def insight_medians(rows)
      INSIGHT_COLUMNS.each_with_object({}) do |(key, _, _), out|
        next if key.end_with?("_spread")

        out[key] = median(rows.map { |row| row[key] }).round(2)
        spread = key.to_s.sub(/_pct\z/, "_spread").to_sym
        out[spread] = rows.map { |row| format("%+.1f", row[key]) }.join(", ") if spread != key
      end.merge(errors: rows.sum { |row| row[:errors] })
    end

    def median(values) = percentile(values, 50)

    def percentile(values, pct)
      sorted = values.sort
      at = (sorted.size - 1) * pct / 100.0
      sorted[at.floor] + ((sorted[at.ceil] - sorted[at.floor]) * (at - at.floor))
    end
  end
end
