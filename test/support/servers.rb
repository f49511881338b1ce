# frozen_string_literal: true

require "etc"
require "fileutils"
require "socket"
require "tmpdir"

module EvtTest
  # Real servers for the client tests: redis-server, memcached, PostgreSQL and MariaDB from Debian, and
  # s3rver (an S3-like server) from npm (bin/setup installs them), each started once per test
  # process on a free loopback port, in a temporary directory, and stopped by PID when the process
  # ends. Never a fixed port, never a system service.
  # Where a server is not installed, Servers.<name> skips the calling test, saying why.
  module Servers
    # Seconds a server may take to accept connections.
    START_TIMEOUT = 30
    POSTGRES_BIN = Dir["/usr/lib/postgresql/*/bin"].max_by { |dir| dir[%r{/(\d+)/bin\z}, 1].to_i }
    # Where bin/setup installs s3rver (npm install into the cache), unless EVT_S3RVER names one.
    S3RVER = ENV.fetch("EVT_S3RVER") do
      File.join(ENV.fetch("XDG_CACHE_HOME", File.join(Dir.home, ".cache")), "evt", "s3rver", "node_modules", ".bin", "s3rver")
    end

    # The servers are not under test: bin/test --asan's preloaded libasan stays out of them (initdb
    # hangs with it).
    SERVER_ENV = {"LD_PRELOAD" => nil, "ASAN_OPTIONS" => nil}.freeze

    Server = Struct.new(:name, :port, :pid, :dir, keyword_init: true)

    @servers = {}
    @lock = Mutex.new

    class << self
      # @return [Server] redis-server on 127.0.0.1, no persistence
      def redis(test)
        start(test, :redis, "redis-server") do |port, dir|
          [["redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", dir, "--daemonize", "no", "--loglevel", "warning"]]
        end
      end

      # @return [Server] memcached on 127.0.0.1, TCP only
      def memcached(test)
        start(test, :memcached, "memcached") do |port, _dir|
          [["memcached", "-l", "127.0.0.1", "-p", port.to_s, "-U", "0", "-m", "64", "-c", "4096",
            *(Process.uid.zero? ? ["-u", "nobody"] : [])]]
        end
      end

      # @return [Server] PostgreSQL on 127.0.0.1, a fresh cluster with the superuser "evt" and no
      #   password (trust), fsync off. As root the cluster runs as the postgres user, as it must.
      def postgres(test)
        test.skip "PostgreSQL is not installed (bin/setup installs it)" unless POSTGRES_BIN

        start(test, :postgres, File.join(POSTGRES_BIN, "postgres")) do |port, dir|
          data = File.join(dir, "data")
          user = Process.uid.zero? ? "postgres" : nil
          if user
            FileUtils.chown_R(user, nil, dir)
            FileUtils.chmod(0o700, dir)
          end
          run_as(user, File.join(POSTGRES_BIN, "initdb"), "-D", data, "-U", "evt", "-A", "trust", "--no-sync")
          # It listens before it takes connections ("the database system is starting up"):
          # ready once pg_isready says it accepts them.
          # (SERVER_ENV: under bin/test --asan, libasan preloaded into pg_isready hangs it.)
          pg_isready = File.join(POSTGRES_BIN, "pg_isready")
          ready = -> { system(SERVER_ENV, pg_isready, "-q", "-t", "2", "-h", "127.0.0.1", "-p", port.to_s) }
          [[*as(user), File.join(POSTGRES_BIN, "postgres"), "-D", data, "-p", port.to_s, "-k", dir,
            "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off", "-c", "max_connections=200"], ready]
        end
      end

      # @return [Server] MariaDB on 127.0.0.1, a fresh data directory, no grant tables (any user
      #   connects without a password), no disk syncs. As root the server runs as the mysql user.
      def mariadb(test)
        start(test, :mariadb, "mariadbd") do |port, dir|
          data = File.join(dir, "data")
          user = Process.uid.zero? ? "mysql" : nil
          FileUtils.chown_R(user, nil, dir) if user
          run_as(nil, "mariadb-install-db", "--no-defaults", "--datadir=#{data}", "--auth-root-authentication-method=normal",
                 "--skip-test-db", *(user ? ["--user=#{user}"] : []))
          [["mariadbd", "--no-defaults", "--datadir=#{data}", "--port=#{port}", "--bind-address=127.0.0.1",
            "--socket=#{File.join(dir, "mariadb.sock")}", "--skip-grant-tables", "--skip-name-resolve",
            "--innodb-flush-log-at-trx-commit=0", "--max-connections=200", *(user ? ["--user=#{user}"] : [])]]
        end
      end

      # @return [Server] s3rver on 127.0.0.1, path-style buckets, its data in a temporary directory;
      #   it takes any well-formed signature of its fixed credentials (S3RVER / S3RVER).
      def s3(test)
        test.skip "node is not installed (bin/setup installs it, for s3rver)" unless installed?("node")
        start(test, :s3, S3RVER) do |port, dir|
          [[S3RVER, "--directory", File.join(dir, "data"), "--address", "127.0.0.1", "--port", port.to_s,
            "--silent", "--no-vhost-buckets"]]
        end
      end

      private

      def start(test, name, program)
        @lock.synchronize do
          server = @servers[name]
          return server if server
          test.skip "#{File.basename(program)} is not installed (bin/setup installs it)" unless installed?(program)

          dir = Dir.mktmpdir("evt-#{name}-")
          port = free_port
          command, ready = yield(port, dir)
          log = File.join(dir, "server.log")
          pid = Process.spawn(SERVER_ENV, *command, in: File::NULL, out: log, err: log, pgroup: true)
          server = Server.new(name: name, port: port, pid: pid, dir: dir)
          @servers[name] = server
          wait_until_listening(server, log, ready)
          server
        end
      end

      def installed?(program)
        program.include?("/") ? File.executable?(program) : ENV.fetch("PATH", "").split(":").any? { |d| File.executable?(File.join(d, program)) }
      end

      def free_port
        server = TCPServer.new("127.0.0.1", 0)
        server.local_address.ip_port
      ensure
        server&.close
      end

      # Until the server takes connections on its port (and `ready`, if given, says it serves them).
      def wait_until_listening(server, log, ready = nil)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + START_TIMEOUT
        loop do
          begin
            TCPSocket.new("127.0.0.1", server.port).close
            return if ready.nil? || ready.call
          rescue SystemCallError
            nil
          end
          if Process.waitpid(server.pid, Process::WNOHANG) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
            raise "#{server.name} did not start on port #{server.port}: #{File.read(log)[-2000..] || File.read(log)}"
          end

          sleep 0.05
        end
      end

      # setpriv execs the command in place: the PID spawned is the server's own, for the signals.
      def as(user)
        user ? ["setpriv", "--reuid=#{user}", "--regid=#{user}", "--init-groups", "--"] : []
      end

      def run_as(user, *command)
        out = IO.popen(SERVER_ENV, [*as(user), *command, err: %i[child out]], &:read)
        raise "#{command.first} failed: #{out}" unless $?.success?
      end

      # PostgreSQL takes SIGINT, its fast shutdown: SIGTERM would wait for this process's own
      # connections to end. Whatever is still there after 10 s is killed, its process group with it.
      def stop_all
        @servers.each_value do |server|
          Process.kill(server.name == :postgres ? :INT : :TERM, server.pid)
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
          until Process.waitpid(server.pid, Process::WNOHANG)
            if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
              Process.kill(:KILL, -server.pid)
              Process.wait(server.pid)
              break
            end
            sleep 0.05
          end
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        ensure
          FileUtils.rm_rf(server.dir)
        end
        @servers.clear
      end
    end

    # After the tests (an at_exit here would run before minitest's own, which runs them), or at the
    # exit of a process without minitest (bin/bench), and only in the process that started the
    # servers (a forked child inherits the hook).
    owner = Process.pid
    if defined?(Minitest)
      Minitest.after_run { stop_all if Process.pid == owner }
    else
      at_exit { stop_all if Process.pid == owner }
    end
  end
end
