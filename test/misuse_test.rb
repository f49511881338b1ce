# frozen_string_literal: true

require "test_helper"

# Misuse, tried case by case on this run's backend: each input of Ruby's interfaces runs in a
# scheduled fiber under Evt.run and, for comparison, in a thread without a scheduler, and must give
# the same outcome (the value, or the error's class and message); each input of evt's own interface
# gives the error it documents. Nothing may crash or hang, and no fiber may be lost (Evt.run
# returns only when every fiber has ended; each case has 20 s). docs/behaviour.md's table "Misuse
# tried" is made from this list (EVT_MISUSE_TABLE=write rewrites it), and the last test keeps it so.
class MisuseTest < Minitest::Test
  include EvtTest

  # Ruby's interfaces: what Ruby gives without a scheduler is what evt must give.
  RUBY = [
    "sleep(-1)", "sleep(Float::NAN)", 'sleep("1")',
    "Timeout.timeout(Float::NAN) { sleep 0.01; :done }", 'Timeout.timeout("1") { }',
    "IO.select([reader], nil, nil, -1)", "IO.select([reader], nil, nil, Float::NAN)", "IO.select([1], nil, nil, 0)",
    "reader.wait_readable(-1)", "reader.wait_readable(Float::NAN)", "reader.wait_readable(0.001)",
    "reader.timeout = -1", "reader.timeout = 0.001; reader.read(1)",
    "reader.read_nonblock(1)", "reader.read(-1)", "reader.readpartial(-1)", "writer.read(1)", 'reader.write("x")',
    "reader.close; reader.read(1)", "reader.close; reader.wait_readable(0)", 'writer.close; writer.write("x")',
    'reader.close; writer.write("x")',
    "Thread::Queue.new.pop(timeout: -1)", 'Thread::Queue.new.pop(timeout: "1")', "Thread::Queue.new.tap(&:close).pop",
    "Thread::SizedQueue.new(1).tap { |q| q << 1 }.push(2, timeout: -1)",
    "Thread::Mutex.new.unlock", "Thread::Mutex.new.tap(&:lock).lock",
    "Thread::ConditionVariable.new.wait(Thread::Mutex.new, 0.001)",
    "Thread.new { sleep }.then { |t| t.join(-1).tap { t.kill } }", 'Thread.new { }.join("1")',
    "Process.wait(999_999_999)", "Process.wait2",
    'File.open(Dir.tmpdir).read(1)', 'File.open("/dev/null").read(1)', 'File.open("/dev/zero").read(4)',
    'TCPSocket.new("127.0.0.1", closed_port)', 'Addrinfo.getaddrinfo("name.invalid", 80)',
  ].freeze

  # evt's own interface: the error it documents.
  EVT = {
    "Evt.run" => ArgumentError,
    "Evt::Scheduler.new(backend: 42)" => TypeError,
    "Evt::Scheduler.new(backend: :nope)" => ArgumentError,
    "Evt::Scheduler.new(pool_size: -1)" => ArgumentError,
    "Evt::Scheduler.new(stall: 0)" => ArgumentError,
    'Evt::Scheduler.new(stall: "1")' => ArgumentError,
    "Fiber.schedule" => ArgumentError,
    "Fiber.schedule(blocking: true) { }" => ArgumentError,
    "Fiber.scheduler.close" => FiberError,
    "Evt.run { sleep 0.001; :inner }" => nil, # nested: a scheduler of its own, then this one's again
    "scheduler_of_another_thread.run" => ThreadError,
  }.freeze

  # What a case gives: "value: ..." or "Class: message" (ports, pids and this machine's backends
  # left out).
  def outcome(code)
    reader, writer = IO.pipe
    value = eval(code, binding_for(reader, writer), __FILE__, __LINE__) # rubocop:disable Security/Eval
    "value: #{value.inspect}"
  rescue Exception => e # rubocop:disable Lint/RescueException: every error is the finding
    "#{e.class}: #{e.message.gsub(/(port|pid) \d+/, '\1 N').sub(/available: .*/, "available: (this machine's backends)")}"
  ensure
    [reader, writer].each { |io| io.close unless io.closed? }
  end

  def binding_for(reader, writer)
    closed_port = TCPServer.new("127.0.0.1", 0).then { |server| server.local_address.ip_port.tap { server.close } }
    scheduler_of_another_thread = @other_scheduler
    binding.tap { |b| [reader, writer, closed_port, scheduler_of_another_thread].size && b }
  end

  # The outcome without a scheduler (a thread of its own) and under evt (a scheduled fiber).
  def both(code)
    plain = Thread.new { outcome(code) }.value
    under = Thread.new do
      got = nil
      Evt.run { Fiber.schedule { got = outcome(code) } }
      got
    end
    [plain, under.join(20) ? under.value : "HANG: the case did not end in 20 s"]
  end

  # A scheduler with a fiber waiting in it, in another thread.
  def with_other_thread_scheduler
    reader, writer = IO.pipe
    ready = Thread::Queue.new
    thread = Thread.new do
      Evt.run do
        Fiber.schedule { reader.read(1) }
        ready << Fiber.scheduler
      end
    end
    @other_scheduler = ready.pop
    yield
  ensure
    writer&.write("x")
    thread&.join
    [reader, writer].each { |io| io&.close }
  end

  def test_rubys_interfaces_give_under_evt_what_they_give_without_a_scheduler
    differences = RUBY.filter_map do |code|
      plain, under = both(code)
      "#{code}\n  without a scheduler: #{plain}\n  under evt:           #{under}" unless plain == under
    end
    assert_empty differences, differences.join("\n")
  end

  def test_evts_own_interface_gives_the_errors_it_documents
    with_other_thread_scheduler do
      EVT.each do |code, expected|
        _, under = both(code)
        if expected
          assert_match(/\A#{Regexp.escape(expected.name)}: evt/, under, code) unless code == "Evt.run"
          assert_match(/\A#{Regexp.escape(expected.name)}: /, under, code)
        else
          assert_match(/\Avalue: /, under, code)
        end
      end
    end
  end

  # The table, made from the cases: input, without a scheduler, under evt.
  def table
    rows = RUBY.map do |code|
      plain, under = both(code)
      [code, plain, under == plain ? "the same" : under]
    end
    with_other_thread_scheduler { EVT.each_key { |code| rows << [code, "(evt's own)", both(code).last] } }
    cell = ->(text) { text.gsub("|", "\\|").gsub("\n", " ") }
    ["| input | without a scheduler | under evt |", "|---|---|---|",
     *rows.map { |row| "| `#{cell.call(row[0])}` | #{cell.call(row[1])} | #{cell.call(row[2])} |" }].join("\n")
  end

  DOC = File.expand_path("../docs/behaviour.md", __dir__)
  SECTION = /(<!-- misuse-table: test\/misuse_test\.rb -->\n).*?(<!-- \/misuse-table -->)/m

  # The table in docs/behaviour.md is this list's (on Ruby 4.0, whose messages it quotes).
  def test_the_table_in_the_docs_is_this_lists
    skip "the table quotes Ruby 4.0's messages" unless RUBY_VERSION >= "4.0" && RUBY_VERSION < "4.1"
    made = table
    if ENV["EVT_MISUSE_TABLE"] == "write"
      File.write(DOC, File.read(DOC).sub(SECTION) { "#{Regexp.last_match(1)}#{made}\n#{Regexp.last_match(2)}" })
    end
    written = File.read(DOC)[SECTION]
    assert written, "docs/behaviour.md has no misuse-table section"
    assert_equal made, written.lines[1..-2].join.chomp,
                 "docs/behaviour.md's table is not this list's: EVT_MISUSE_TABLE=write ruby -Ilib -Itest test/misuse_test.rb"
  end
end
