# frozen_string_literal: true

module Bench
  # bin/bench's chart: one panel per scenario, a bar per subject (the figure the scenario is judged
  # by, lower is better), labelled with the value and its ratio to the best peer (and to C).
  class Chart
    METRICS = {"http-keepalive" => [:cpu_us_per_req, "server CPU µs per request"],
               "http-close" => [:cpu_us_per_req, "server CPU µs per request"],
               "http-redis" => [:cpu_us_per_req, "server CPU µs per request, a Redis GET in each"],
               "pipe-pingpong" => [:seconds, "seconds"],
               "big-reads" => [:cpu_seconds, "CPU seconds, client and server"],
               "thread-server" => [:seconds, "seconds, fiber clients of a thread server in one process"],
               "thread-clients" => [:seconds, "seconds, thread clients of a fiber server in one process"],
               "write-pieces" => [:split_ms, "ms per keep-alive round trip, answer written as io.write(head, body)"],
               "timers" => [:seconds, "seconds"],
               "sleep-fanout" => [:seconds, "seconds, fibers sleeping 1-3 ms (about 2.6 s of sleeps)"],
               "fiber-memory" => [:bytes_per_fiber, "bytes per waiting fiber"],
               "idle-connections" => [:rss_mb, "RSS MB"],
               "close-waiters" => [:close_avg_us, "µs per IO#close with a reader waiting, at the largest N"],
               "blocking-ops" => [:seconds, "seconds"],
               "http-cpu" => [:cpu_us_per_req, "CPU µs per request, every worker counted"],
               "falcon" => [:cpu_us_per_req, "server CPU µs per request"],
               "rails" => [:cpu_us_per_req, "server CPU µs per request"]}.freeze
    WIDTH = 960
    LABEL = 120
    BAR = 520
    ROW = 20

    def initialize(document)
      @document = document
    end

    # The falcon and rails scenarios' apps by their titles, where bin/bench is loaded.
    def app_title(scenario, app)
      titles = scenario == "rails" ? (RailsScenario::APPS.transform_values { _1[1] } if defined?(RailsScenario)) : (FALCON_APPS if defined?(FALCON_APPS))
      titles ? titles.fetch(app, app) : app
    end

    def to_svg
      y = 58
      body = [text(16, 24, "evt bin/bench — Ruby #{@document[:ruby]}, #{@document[:cores]} cores, " \
                           "#{@document[:date]} (#{@document[:run]} run); lower is better", size: 15, weight: "bold")]
      [["evt", "#2f6fb3"], ["peers", "#d08a2e"], ["C reference", "#777"]].each_with_index do |(name, color), i|
        body << %(<rect x="#{16 + i * 110}" y="33" width="12" height="12" fill="#{color}"/>)
        body << text(32 + i * 110, 44, name)
      end
      # A panel per scenario, and per app where a scenario has several (falcon).
      @document[:results].group_by { |r| [r[:scenario], r[:app]] }.each do |(scenario, app), rows|
        key, unit = METRICS.fetch(scenario)
        title = app ? "#{scenario} (#{app_title(scenario, app)})" : scenario
        body << text(16, y + 14, "#{title}: #{unit}", size: 13, weight: "bold")
        y += 22
        max = rows.filter_map { |r| r[key] }.max.to_f
        rows.each do |row|
          body << text(16, y + 14, row[:subject])
          if row[key]
            width = max.positive? ? (row[key] / max * BAR).clamp(1, BAR) : 1
            color = row[:subject].match?(/(\A|-)evt(-|\z)/) ? "#2f6fb3" : (row[:subject].start_with?("c-") ? "#777" : "#d08a2e")
            body << %(<rect x="#{LABEL}" y="#{y + 3}" width="#{width.round(1)}" height="#{ROW - 6}" fill="#{color}"/>)
            body << text(LABEL + width + 6, y + 14, label(row, key))
          else
            body << text(LABEL, y + 14, row[:skipped] ? "n/a: #{row[:skipped]}" : "failed: #{row[:error]}", fill: "#999")
          end
          y += ROW
        end
        y += 14
      end
      <<~SVG
        <svg xmlns="http://www.w3.org/2000/svg" width="#{WIDTH}" height="#{y + 10}" viewBox="0 0 #{WIDTH} #{y + 10}" font-family="sans-serif">
        <rect width="100%" height="100%" fill="white"/>
        #{body.join("\n")}
        </svg>
      SVG
    end

    private

    def label(row, key)
      parts = [format(row[key] < 10 ? "%.2f" : "%.1f", row[key])]
      parts << format("%.2f× best peer", row[:vs_best_peer]) if row[:vs_best_peer] && row[:subject] != row[:best_peer]
      parts << "best peer" if row[:subject] == row[:best_peer]
      parts << format("%.2f× %s", row[:vs_c], row[:best_c] || "C") if row[:vs_c]
      parts << format("%.2f× the first", row[:vs_first]) if row[:vs_first]
      parts << format("%.2f× its req/s", row[:rps_vs_first]) if row[:rps_vs_first]
      if row[:vs_io_event] && row[:subject] != row[:io_event_row]
        parts << format("%.2f× %s", row[:vs_io_event], row[:io_event_row])
      end
      parts << "HANG: #{row[:woken]} of #{row[:n]} woken" if row[:hang]
      parts.join(" · ")
    end

    def text(x, y, content, size: 12, weight: "normal", fill: "#222")
      escaped = content.to_s.gsub("&", "&amp;").gsub("<", "&lt;").gsub(">", "&gt;")
      %(<text x="#{x.round(1)}" y="#{y}" font-size="#{size}" font-weight="#{weight}" fill="#{fill}">#{escaped}</text>)
    end
  end
end
