# frozen_string_literal: true

require "test_helper"
require "rbconfig"
require "open3"

# Fault: io_uring refused at run time, as in a container whose seccomp profile leaves it out. A
# real refusal: test/support/seccomp_exec.c, compiled here, installs a seccomp filter under which
# io_uring_setup fails with EPERM and execs a Ruby child. There the automatic choice must fall back
# to epoll (and work), saying why in Scheduler#backend_fallbacks and, with EVT_DEBUG=1, once on
# $stderr; asking for io_uring, by argument or EVT_BACKEND, raises ArgumentError saying why. Only the child is filtered; it runs from every backend's run, in well under a second.
class FaultUringRefusedTest < Minitest::Test
  LIB = File.expand_path("../lib", __dir__)
  HELPER = File.expand_path("support/seccomp_exec.c", __dir__)
  REASON = "io_uring is refused by this process's seccomp filter (as a container's default profile does)"

  CHILD = <<~'RUBY'
    require "evt"
    def outcome
      yield
    rescue Exception => e
      "#{e.class}: #{e.message}"
    end
    puts Evt::Scheduler.availables.join(",")
    puts outcome { Evt::Scheduler.new.tap(&:close).backend }
    puts outcome { Evt::Scheduler.new.tap(&:close).backend_fallbacks.inspect }
    # The fallback works: a sleep and a pipe between fibers on the backend chosen.
    puts outcome {
      Evt.run do
        r, w = IO.pipe
        Fiber.schedule { sleep 0.001; w.write("fell back") }
        r.read(9).tap { [r, w].each(&:close) }
      end
    }
    puts outcome { Evt::Scheduler.new(backend: :io_uring) }
    ENV["EVT_BACKEND"] = "io_uring"
    puts outcome { Evt::Scheduler.new }
  RUBY

  def setup
    skip "io_uring is a backend of the C extension, which this run does not load" unless Evt.extension?
    skip "this build of evt has no io_uring backend" unless Evt::Loop.backends.include?(:io_uring)
    skip "seccomp_exec knows x86_64 and aarch64 Linux only, not #{RUBY_PLATFORM}" unless RUBY_PLATFORM.match?(/\A(x86_64|aarch64)-linux/)
    reason = Evt::Loop.probe(:io_uring)
    skip "io_uring cannot run here even without a filter (#{reason})" if reason
  end

  # Compiles the helper into +dir+; skips when there is no compiler or no seccomp headers.
  def build_helper(dir)
    compiler = ENV.fetch("CC", "cc")
    binary = File.join(dir, "seccomp_exec")
    output, status = Open3.capture2e(compiler, "-O", "-o", binary, HELPER)
  rescue SystemCallError => e
    skip "no C compiler to build the seccomp helper (#{compiler}: #{e.message})"
  else
    skip "cannot build the seccomp helper with #{compiler}:\n#{output}" unless status.success?
    binary
  end

  def test_automatic_choice_falls_back_to_epoll_and_a_request_for_io_uring_says_why
    lines = Dir.mktmpdir("evt-seccomp") do |dir|
      helper = build_helper(dir)
      # The child chooses for itself: no backend or extension setting of this run reaches it.
      env = {"EVT_BACKEND" => nil, "EVT_NO_EXTENSION" => nil, "EVT_DEBUG" => "1"}
      # (-W:no-experimental: Ruby 4.0 warns once that the IO::Buffer it hands io_read is experimental.)
      output, status = Open3.capture2e(env, helper, RbConfig.ruby, "-W:no-experimental", "-I", LIB, "-e", CHILD)
      skip "seccomp is not available here: #{output}" if status.exitstatus == 77
      assert_predicate status, :success?, output
      output.lines.map(&:chomp)
    end
    debug = lines.delete_at(lines.index { |line| line.start_with?("evt: the ") } || lines.size)
    availables, default, fallbacks, run, requested, from_env = lines
    expected = Evt::Scheduler.availables - [:io_uring]
    assert_equal expected.map(&:to_s), availables.split(","), "io_uring must be left out, the others kept"
    assert_equal "epoll", default, "the automatic choice falls back to epoll"
    assert_equal({ io_uring: REASON }.inspect, fallbacks, "backend_fallbacks says why not io_uring")
    assert_equal "evt: the epoll backend (not faster ones: io_uring: #{REASON})", debug, "EVT_DEBUG=1 says it once"
    assert_equal "fell back", run
    assert_equal "ArgumentError: evt: backend :io_uring cannot run here (#{REASON}); " \
                 "available: #{expected.map(&:inspect).join(", ")}", requested
    assert_equal "ArgumentError: evt: EVT_BACKEND :io_uring cannot run here (#{REASON}); " \
                 "available: #{expected.map(&:inspect).join(", ")}", from_env
  end
end
