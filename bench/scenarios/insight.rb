# frozen_string_literal: true

module Bench
  scenario "insight-cost",
           metric: :stall_keepalive_pct,
           note: "(per C backend, three servers at once: evt-<backend>, evt-<backend>-stall (stall reports on, " \
                 "threshold 100 ms, nothing trips them) and evt-<backend>-stats (a fiber reads scheduler.stats once a " \
                 "second); for each load, rounds in which wrk loads each server in turn for a second, the order " \
                 "rotated every round; CPU ns per request of each server in each turn, every thread's, from " \
                 "/proc/PID/task/*/schedstat; a cost is the median over the rounds of that round's (server's CPU " \
                 "per request / base's - 1), so the machine's drift over minutes falls on both sides of each " \
                 "ratio; spread: [p25, p75] of the rounds' costs, or with --repeat every run's cost, the cost being " \
                 "their median; base us/req: the median of the base server's turns)"

  # insight-cost: rounds per load (full and --quick), and the seconds of wrk each server gets per round.
  INSIGHT_ROUNDS = {full: 40, quick: 3}.freeze
  INSIGHT_TURN = 1
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
      figures = {rounds: @size[:insight_rounds], turn_s: INSIGHT_TURN, connections: @connections, errors: 0}
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

    # CPU ns per request of each server in each round: [[per round] per server].
    def insight_turns(servers, urls, headers, figures)
      spent = servers.map { [] }
      @size[:insight_rounds].times do |round|
        servers.each_index.to_a.rotate(round).each do |i|
          before = threads_cpu_ns(servers[i][:pid])
          report = wrk(urls[i], @connections, INSIGHT_TURN, headers)
          spent[i] << (threads_cpu_ns(servers[i][:pid]) - before).fdiv(report[:requests])
          figures[:errors] += report[:errors]
        end
      end
      spent
    end

    # CPU time of every thread of +pid+ so far, in ns (schedstat counts in ns; /proc/PID/stat in
    # ticks of 10 ms, too coarse for a second's turn).
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
