# frozen_string_literal: true

# A small API-only Rails application, ActiveRecord on PostgreSQL, with fiber isolation: what
# test/rails_test.rb serves under Falcon (evt's selector) and Puma, and `bin/bench --only rails`
# measures. apps/rails/serve.rb starts it; its settings come from the environment:
#
#   DATABASE_URL   postgres://user@host:port/db (required)
#   RAILS_POOL     ActiveRecord's pool size (5)
#   REDIS_URL      for /remote (redis://127.0.0.1:6379)
#   UPSTREAM_URL   the HTTP service /remote calls
#
# Endpoints (GET): /instant, /db (a query that waits DB_SLEEP s, 0.05 unless ?sleep=), /remote (an
# HTTP call and a Redis INCR), /stream (chunks written as they are made), and the probes the
# tests read: /current, /isolation, /timeout, /statement_timeout, /pool.
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "net/http"
require "redis-client"
require "timeout"

module EvtRails
  class Application < Rails::Application
    config.load_defaults 8.1
    config.root = __dir__
    config.api_only = true
    config.eager_load = true
    config.enable_reloading = false
    config.consider_all_requests_local = false
    config.secret_key_base = "evt's test application: nothing secret here"
    config.hosts.clear
    level = ENV.fetch("RAILS_LOG_LEVEL", "warn")
    config.logger = ActiveSupport::Logger.new($stderr, level: level)
    config.log_level = level.to_sym
    # Every request a fiber of its own under Falcon: Rails' per-request state must follow fibers.
    config.active_support.isolation_level = :fiber
    config.active_record.dump_schema_after_migration = false
  end

  DB_SLEEP = 0.05

  def self.database_url
    url = ENV.fetch("DATABASE_URL") { abort "apps/rails: DATABASE_URL is not set" }
    "#{url}#{url.include?("?") ? "&" : "?"}pool=#{Integer(ENV.fetch("RAILS_POOL", "5"))}"
  end

  def self.redis
    @redis ||= RedisClient.config(url: ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379"))
                          .new_pool(size: Integer(ENV.fetch("RAILS_POOL", "5")), timeout: 5)
  end

  def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

ENV["DATABASE_URL"] = EvtRails.database_url

class Current < ActiveSupport::CurrentAttributes
  attribute :request_id
end

class ProbesController < ActionController::API
  def instant
    render plain: "ok"
  end

  # A query that waits in PostgreSQL: the connection is the pool's only for the query.
  def db
    seconds = Float(params.fetch(:sleep, EvtRails::DB_SLEEP))
    value = ActiveRecord::Base.with_connection do |connection|
      connection.select_value("SELECT 'db' FROM pg_sleep(#{seconds})")
    end
    render plain: value
  end

  def remote
    upstream = Net::HTTP.get(URI(ENV.fetch("UPSTREAM_URL")))
    count = EvtRails.redis.call("INCR", "evt:remote")
    render json: {upstream: upstream, count: count}
  end

  # Chunks sent as they are made (Rack streams an enumerable body).
  def stream
    count = Integer(params.fetch(:count, 5))
    pause = Float(params.fetch(:pause, 0.01))
    headers["Content-Type"] = "text/plain"
    headers["Cache-Control"] = "no-cache"
    self.response_body = Enumerator.new do |out|
      count.times do |i|
        sleep pause unless i.zero?
        out << "chunk #{i}\n"
      end
    end
  end

  # Current attributes start empty in every request and stay the request's own while others run.
  def current
    before = Current.request_id
    Current.request_id = params.fetch(:id)
    sleep Float(params.fetch(:pause, 0.02))
    render json: {before: before, after: Current.request_id}
  end

  # Rails' per-fiber state: set here, not seen by a fiber this request makes, nor by other requests.
  def isolation
    state = ActiveSupport::IsolatedExecutionState
    before = state[:evt_probe]
    state[:evt_probe] = params.fetch(:id)
    child = Fiber.new { state[:evt_probe] }.resume
    sleep Float(params.fetch(:pause, 0.02))
    render json: {level: state.isolation_level, before: before, mine: state[:evt_probe], child: child}
  end

  # Timeout.timeout around a query that would take 2 s; then the pool gives a connection that works.
  def timeout
    outcome(Timeout::Error) do
      Timeout.timeout(Float(params.fetch(:after, 0.1))) do
        ActiveRecord::Base.with_connection { |c| c.select_value("SELECT 'late' FROM pg_sleep(2)") }
      end
    end
  end

  # PostgreSQL's statement_timeout cancels the query: ActiveRecord::QueryCanceled.
  def statement_timeout
    outcome(ActiveRecord::StatementInvalid) do
      ActiveRecord::Base.with_connection do |connection|
        connection.transaction do
          connection.execute("SET LOCAL statement_timeout = '100ms'")
          connection.select_value("SELECT 'late' FROM pg_sleep(2)")
        end
      end
    end
  end

  def pool
    render json: ActiveRecord::Base.connection_pool.stat
  end

  private

  # Renders how the block ended (the class of the error among +errors+ it raised, or nil), how long
  # it took, and what a query on a connection from the pool gives afterwards.
  def outcome(*errors)
    started = EvtRails.now
    error = begin
      yield
      nil
    rescue *errors => e
      e.class.name
    end
    render json: {error: error, took: (EvtRails.now - started).round(3), after: select_one}
  end

  def select_one
    ActiveRecord::Base.with_connection { |c| c.select_value("SELECT 1") }
  end
end

EvtRails::Application.initialize!

EvtRails::Application.routes.draw do
  %w[instant db remote stream current isolation timeout statement_timeout pool].each do |name|
    get name, to: "probes##{name}"
  end
end
